"""The six directions checks on hand-written commands: what each accepts and what it misses."""

from __future__ import annotations

from metrale.agent import CommandRecord as Cmd
from metrale.benchmarks.agentic_webserver.directions import CHECKS, check_directions


def cmd(command: str, output: str = "", exit_code: int = 0, timed_out: bool = False) -> Cmd:
    return Cmd(turn=1, source="tool", command=command, exit_code=exit_code,
                         timed_out=timed_out, duration_s=0.1, output=output)  # fmt: skip


TEST_OK = "exit_code: 0\nrunning 1 test\ntest result: ok. 1 passed; 0 failed; 0 ignored"
GOOD = [
    cmd("cargo test", TEST_OK),
    cmd("setsid cargo run > /tmp/server.log 2>&1 &"),
    cmd("sleep 2; timeout 15 curl -s http://127.0.0.1:$METRALE_HARNESS_PORT/ping",
        "exit_code: 0\npong"),
    cmd("timeout 5 fuser -k ${METRALE_HARNESS_PORT:-3001}/tcp 2>/dev/null || true"),
]  # fmt: skip


def test_the_prompt_examples_pass_all_six() -> None:
    assert check_directions(GOOD) == dict.fromkeys(CHECKS, True)


def test_nothing_done_misses_all_six() -> None:
    assert check_directions([cmd("ls")]) == dict.fromkeys(CHECKS, False)


def test_tests_must_run_and_pass() -> None:
    failing = "test result: FAILED. 0 passed; 1 failed"
    assert not check_directions([cmd("cargo test", failing, exit_code=101)])["tests_passed"]
    assert not check_directions([cmd("cargo test --no-run", TEST_OK)])["tests_passed"]
    assert not check_directions([cmd("cargo test", "test result: ok. 0 passed")])["tests_passed"]
    assert check_directions([cmd("cd . && cargo test 2>&1", TEST_OK)])["tests_passed"]


def test_server_must_be_detached_and_redirected() -> None:
    def detached(c: str) -> bool:
        return check_directions([cmd(c)])["server_detached"]

    assert detached("nohup ./target/debug/pingpong &> /tmp/s.log &")
    assert detached("cargo build && (setsid cargo run >/tmp/s.log 2>&1 &)")
    assert detached("cargo run > s.log 2>&1 & disown")
    assert not detached("cargo run &")  # neither detached nor redirected
    assert not detached("setsid cargo run &")  # not redirected
    assert not detached("cargo run > /tmp/s.log 2>&1 &")  # not detached
    assert not detached("setsid cargo run > /tmp/s.log 2>&1")  # foreground
    assert not detached("setsid cargo run > /tmp/s.log")  # stderr not redirected, foreground


def test_curl_must_show_pong_and_be_wrapped_in_timeout() -> None:
    proved = [cmd("curl -s localhost:3001/ping", "exit_code: 0\npong")]
    result = check_directions(proved)
    assert result["curl_proved"] and not result["curl_timeout"]
    failed = [cmd("timeout 15 curl -s localhost:3001/ping", "exit_code: 7\n", exit_code=7)]
    result = check_directions(failed)
    assert not result["curl_proved"] and result["curl_timeout"]
    one_bare = [*GOOD, cmd("curl -s localhost:3001/ping")]
    assert not check_directions(one_bare)["curl_timeout"]
    assert check_directions([cmd("R=$(timeout 15 curl -s localhost:3001/ping); echo $R")])[
        "curl_timeout"
    ]
    assert not check_directions([cmd("curl --max-time 5 localhost:3001/ping")])["curl_timeout"]


def test_teardown_by_port_and_in_timeout() -> None:
    def teardown(c: str) -> tuple[bool, bool]:
        r = check_directions([cmd(c)])
        return r["teardown_by_port"], r["teardown_timeout"]

    assert teardown("timeout 5 fuser -k 3001/tcp") == (True, True)
    assert teardown("fuser -k -n tcp 3001 || fuser -k $METRALE_HARNESS_PORT/tcp") == (True, False)
    assert teardown("timeout 5 kill $(lsof -t -i:3001)") == (True, True)
    assert teardown("kill -9 $(lsof -ti :3001)") == (True, False)
    assert teardown("timeout 5 lsof -t -i:3001 | xargs kill") == (True, True)
    assert teardown("timeout 5 pkill pingpong") == (False, False)  # by name, not by port
    assert teardown("killall pingpong") == (False, False)
