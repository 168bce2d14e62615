"""serve's live session source end to end: terminal_bench's fix-git agents in real bwrap
sandboxes as 8 lanes against `metrale sim --replay`, per-turn TTFT and the reward under load;
agentic_webserver's agents building a real server the same way; Ctrl-C in the middle leaves no
sandbox; bad combinations are one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from metrale.benchmarks.agentic_webserver.warm import WarmCache
from metrale.benchmarks.serve.live import LiveSource, SessionRecord, parse_live_params
from metrale.benchmarks.serve.session_metrics import live_by_task
from metrale.benchmarks.terminal_bench.benchmark import TerminalBenchBenchmark
from metrale.rollout import RolloutRecord
from tests.benchmarks.agentic_webserver.conftest import warm_cargo  # noqa: F401 (a fixture)
from tests.benchmarks.serve.test_sessions_cli import sim_counter
from tests.conftest import run_cli, start_sim
from tests.faults.helpers import count_lines, lines, spawn, stop, wait_for
from tests.runtime.engine import require_engine

REPLAY = str(
    resources.files("metrale.benchmarks.terminal_bench")
    .joinpath("replays")
    .joinpath("fix-git.jsonl")
)
#: the shipped tasks as one dataset (each subdirectory a task)
SHIPPED = str(resources.files("metrale.benchmarks.terminal_bench").joinpath("tasks"))
PIDS = Path("/sys/fs/cgroup/pids")
need_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")


def _cgroups() -> set[str]:
    return {p.name for p in PIDS.glob("metrale-bwrap-*")} if PIDS.is_dir() else set()


@pytest.fixture
def temp() -> Iterator[Path]:
    """A traversable temp dir of the test's own (sandboxes run as an unprivileged uid): what
    is left in it after the run is a sandbox that was not stopped."""
    path = Path(tempfile.mkdtemp(prefix="metrale-live-", dir="/tmp"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def live_args(url: str, out: Path) -> list[str]:
    return ["run", "serve", "--target", url, "--no-preflight", "--load", "sessions",
            "--session-source", "live", "--live-params", "task=fix-git", "--runtime", "bwrap",
            "--lanes", "8", "--sessions", "16", "--out", str(out), "--json"]  # fmt: skip


def by_session(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["session"], []).append(r)
    return {k: sorted(v, key=lambda r: r["turn"]) for k, v in out.items()}


@need_bwrap
def test_fix_git_as_8_live_lanes_reports_per_turn_ttft_and_the_reward(
    tmp_path: Path, temp: Path
) -> None:
    require_engine()  # the task's image is built (or reused) for its root
    before = _cgroups()
    out = tmp_path / "run"
    with start_sim("--replay", REPLAY) as sim:
        done = run_cli(
            live_args(sim.url, out), timeout=600, env={**os.environ, "TMPDIR": str(temp)}
        )
        answered = sim_counter(sim.url, "vllm:request_success_total")
    assert done.returncode == 0, done.stderr
    # every call the sim answered is an agent's, on the record: no probe of serve's own
    assert answered == len(lines(out / "requests.jsonl"))
    metrics = json.loads(done.stdout)["result"]["metrics"]
    sessions = lines(out / "sessions.jsonl")
    assert len(sessions) == 16
    for s in sessions:  # the task's own verifier, under load
        rollout = s["rollout"]
        assert rollout["reward"] == 1.0 and rollout["error"] is None, rollout["metrics"]
        assert set(rollout["stages"]) == {"setup", "generation", "scoring"}
        assert rollout["turns"] == 9 and rollout["metrics"]["exit_status"] == "submitted"
    assert metrics["session_reward_mean"] == 1.0 and metrics["session_error_rate"] == 0.0
    assert metrics["sessions"] == 16 and metrics["turns_per_session_mean"] == 9
    rows = [r for r in lines(out / "requests.jsonl") if r["phase"] == "measure"]
    turns = by_session(rows)
    assert set(turns) == {s["session"] for s in sessions} and len(rows) == 16 * 9
    assert all(r["error"] is None and r["ttft_s"] is not None for r in rows)
    # per-turn TTFT for every turn index, as the synthetic and recorded sources report it
    level = json.loads((out / "levels.json").read_text())["levels"][0]
    assert sorted(level["by_turn"], key=int) == [str(t) for t in range(1, 10)]
    assert all(level["by_turn"][str(t)]["ttft_ms_p50"] is not None for t in range(1, 10))
    assert metrics["ttft_ms_p50_turn1"] is not None and metrics["ttft_ms_p50_turn9_16"] is not None
    # tool time is real: before turn t+1, at least the commands turn t ran, as the transcript
    # timed them in the sandbox
    for s in sessions:
        index = s["rollout"]["index"]
        transcript = lines(out / "transcripts" / f"{index}.jsonl")
        ran: dict[int, float] = {}
        for m in transcript:
            if m["role"] == "tool" and "duration_s" in m.get("extra", {}):
                ran[m["extra"]["turn"]] = ran.get(m["extra"]["turn"], 0) + m["extra"]["duration_s"]
        session = turns[s["session"]]
        assert session[0]["tool_s"] == 0
        for t in range(1, 9):
            assert session[t]["tool_s"] > 0
            assert session[t]["tool_s"] >= ran[t] > 0, (t, session[t]["tool_s"], ran)
        prompts = [r["prompt_tokens"] for r in session]
        assert prompts == sorted(prompts) and prompts[0] < prompts[-1]
    assert metrics["session_tool_s_mean"] > 0
    report = run_cli(["report", str(out), "--json"], timeout=120)  # as serve.md shows it
    assert report.returncode == 0, report.stderr
    assert list(temp.glob("metrale-bwrap-*")) == [] and (_cgroups() - before) == set()


def test_live_params_read_a_list_parameter_as_the_benchmark_flag_does() -> None:
    got = parse_live_params("task=/d, tasks=fix-git,log-summary ,max-turns=12")
    assert got == {"task": "/d", "tasks": "fix-git,log-summary", "max_turns": "12"}


def test_a_dataset_as_the_live_source_runs_its_tasks_in_turn() -> None:
    source = LiveSource("terminal_bench", f"task={SHIPPED},tasks=log-summary,fix-git")
    bench = source.bench
    assert isinstance(bench, TerminalBenchBenchmark)
    # session k runs task k mod n, in the order chosen; not the last task past the first n
    names = [bench.run_of(source.new_session()[0]).task.name for _ in range(5)]
    assert names == ["log-summary", "fix-git", "log-summary", "fix-git", "log-summary"]
    whole = LiveSource("terminal_bench", f"task={SHIPPED},task_filter=fix-*")
    assert isinstance(whole.bench, TerminalBenchBenchmark)
    cycle = [whole.bench.run_of(k).task.name for k in range(3)]
    assert cycle == ["fix-git", "fix-money", "fix-git"]


def test_a_session_record_names_its_task_and_the_level_reads_reward_per_task() -> None:
    def rollout(index: int, task: str | None, reward: float | None) -> RolloutRecord:
        metrics: dict[str, Any] = {} if task is None else {"task": task}
        return RolloutRecord(id=f"r-{index}", benchmark="terminal_bench", index=index,
                             started_at=0.0, reward=reward, metrics=metrics)  # fmt: skip

    line = SessionRecord.of(0, "measure", "terminal_bench-3", rollout(3, "fix-git", 1.0))
    assert line.task == "fix-git" and line.rollout.index == 3
    assert SessionRecord.of(0, "measure", "s", rollout(0, None, 1.0)).task is None
    assert live_by_task([(1.0, False, "fix-git"), (1.0, False, "fix-git")]) is None  # one task
    text = live_by_task(
        [(0.0, False, "log-summary"), (1.0, False, "fix-git"), (0.0, False, "fix-git"),
         (None, True, "log-summary")]
    )  # fmt: skip
    assert text == (
        "live sessions by task: fix-git reward 0.5 over 2 sessions (0 errors), "
        "log-summary reward 0 over 2 sessions (1 errors)"
    )


@need_bwrap
def test_a_dataset_as_live_lanes_runs_each_task_in_turn_and_scores_it(
    tmp_path: Path, temp: Path
) -> None:
    """fix-git and log-summary x 4 sessions each against fix-git's replay: a fix-git session
    solves it (reward 1); a log-summary session runs fix-git's commands, writes no report and
    scores 0 (its own verifier); each session names its task."""
    require_engine()  # the tasks' images are built (or reused) for their roots
    before = _cgroups()
    out = tmp_path / "run"
    args = live_args("", out)
    args[args.index("task=fix-git")] = f"task={SHIPPED},tasks=fix-git,log-summary"
    args[args.index("--lanes") + 1], args[args.index("--sessions") + 1] = "4", "8"
    with start_sim("--replay", REPLAY) as sim:
        args[args.index("--target") + 1] = sim.url
        done = run_cli(args, timeout=900, env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr
    sessions = sorted(lines(out / "sessions.jsonl"), key=lambda s: s["rollout"]["index"])
    assert [s["rollout"]["index"] for s in sessions] == list(range(8))
    expect = {"fix-git": 1.0, "log-summary": 0.0}
    for s in sessions:
        task = ["fix-git", "log-summary"][s["rollout"]["index"] % 2]
        assert s["task"] == task == s["rollout"]["metrics"]["task"], s
        assert s["rollout"]["reward"] == expect[task] and s["rollout"]["error"] is None, s
    metrics = json.loads(done.stdout)["result"]["metrics"]
    assert metrics["session_reward_mean"] == 0.5 and metrics["session_error_rate"] == 0.0
    logs = json.loads((out / "result.json").read_text())["result"]["logs"]
    by_task = "fix-git reward 1 over 4 sessions (0 errors), log-summary reward 0 over 4"
    assert any(by_task in log["message"] for log in logs), logs
    assert list(temp.glob("metrale-bwrap-*")) == [] and (_cgroups() - before) == set()


@need_bwrap
def test_agentic_webserver_agents_as_2_live_lanes_build_real_servers(
    warm_cargo: WarmCache,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    replay = resources.files("metrale.benchmarks.agentic_webserver").joinpath("replays")
    out = tmp_path / "run"
    with start_sim("--replay", str(replay.joinpath("good.jsonl"))) as sim:
        done = run_cli(
            ["run", "serve", "--target", sim.url, "--no-preflight", "--load", "sessions",
             "--session-source", "live", "--live-benchmark", "agentic_webserver",
             "--runtime", "bwrap", "--lanes", "2", "--sessions", "2", "--out", str(out),
             "--json"],
            timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sessions = lines(out / "sessions.jsonl")
    assert [s["rollout"]["reward"] for s in sessions] == [1.0, 1.0]
    assert all(s["rollout"]["metrics"]["webserver_ok"] for s in sessions)
    metrics = json.loads(done.stdout)["result"]["metrics"]
    assert metrics["session_reward_mean"] == 1.0 and metrics["turns_per_session_mean"] == 8
    rows = [r for r in lines(out / "requests.jsonl") if r["phase"] == "measure"]
    assert len(rows) == 16 and all(r["error"] is None for r in rows)
    assert all(r["tool_s"] > 0 for r in rows if r["turn"] > 1)


@need_bwrap
def test_ctrl_c_during_live_sessions_stops_every_sandbox(tmp_path: Path, temp: Path) -> None:
    require_engine()
    before = _cgroups()
    out = tmp_path / "run"
    ours: set[str] = set()

    def started(n: int) -> bool:
        ours.update(p.name for p in temp.glob("metrale-bwrap-*"))
        return len(ours) >= n

    # Slow answers: every lane is mid-session, its sandbox running, when the signal comes.
    with start_sim("--replay", REPLAY, "--ttft", "0.5") as sim:
        proc = spawn(live_args(sim.url, out), env={**os.environ, "TMPDIR": str(temp)})
        try:
            wait_for(lambda: count_lines(out / "requests.jsonl") >= 8 and started(8),
                     within_s=300, what="8 sessions under way")  # fmt: skip
        finally:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = stop(proc, timeout=120)
    assert proc.returncode == 130, err
    assert list(temp.glob("metrale-bwrap-*")) == []
    assert (_cgroups() - before) & ours == set()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--load", "sessions", "--session-source", "live", "--live-benchmark", "gsm8k"],
         "no agent loop"),
        (["--load", "sessions", "--session-source", "live", "--live-benchmark", "nope"],
         "no such benchmark"),
        (["--load", "sessions", "--session-source", "live", "--live-params", "task=no-such"],
         "neither a directory nor a task"),
        (["--load", "sessions", "--session-source", "live", "--live-params", "agent=oracle"],
         "calls none"),
        (["--load", "sessions", "--session-source", "live", "--live-params", "rollouts=4"],
         "--sessions decide"),
        (["--load", "sessions", "--session-source", "live", "--live-params", "task"],
         "not KEY=VALUE"),
        (["--session-source", "live"], "give --load sessions"),
        (["--load", "sessions", "--live-params", "task=fix-git"], "--session-source live only"),
        (["--runtime", "bwrap"], "does not apply to serve"),
    ],
)  # fmt: skip
def test_bad_live_combinations_are_one_line_and_exit_2(flags: list[str], needle: str) -> None:
    # The target does not answer: the refusal must come before any work touches it.
    proc = run_cli(["run", "serve", "--target", "http://127.0.0.1:9/v1", *flags], timeout=60)
    assert proc.returncode == 2, proc.stderr
    got = proc.stderr.strip().splitlines()
    assert len(got) == 1 and needle in got[0] and "Traceback" not in proc.stderr, got
