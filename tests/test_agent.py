"""The agent loop with a scripted model: tool calls, fenced fallback, limits, counters."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from metrale import agent as agent_mod
from metrale.agent import Agent, AgentConfig, cap_output, parse_actions
from metrale.endpoint.client import CallRecord, ToolCall
from metrale.runtime.base import ProgramResult


def reply(
    content: str = "",
    calls: Sequence[tuple[str, str]] = (),
    finish: str | None = None,
    tokens: int = 5,
) -> CallRecord:
    return CallRecord(
        started_at=0.0,
        content=content,
        tool_calls=[ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)],
        finish_reason=finish or ("tool_calls" if calls else "stop"),
        completion_tokens=tokens,
    )


def bash(command: str) -> tuple[str, str]:
    return ("bash", json.dumps({"command": command}))


class Script:
    """A model that answers with the next scripted reply (the last one forever)."""

    def __init__(self, *replies: CallRecord) -> None:
        self.replies = list(replies)
        self.requests: list[list[dict[str, Any]]] = []

    async def chat(self, messages: Any, **kw: Any) -> CallRecord:
        self.requests.append(list(messages))
        assert kw["tools"][0]["function"]["name"] == "bash"
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


class FakeRuntime:
    """Speaks the loop's two-step protocol (run with output to a file, then collect it) and
    echoes the command back; `hang` makes commands never return (a runtime gone wrong)."""

    def __init__(self, hang: bool = False) -> None:
        self.commands: list[str] = []
        self.hang = hang
        self.pending = ""

    async def run(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> ProgramResult:
        script = command[2]
        if script.startswith("exec >"):
            text = script.split("\n", 1)[1]
            self.commands.append(text)
            self.pending = f"ran {text}\n"
            if self.hang:
                await asyncio.sleep(3600)
            return ProgramResult(exit_code=0, stdout="", stderr="", duration_s=0.01)
        out, self.pending = self.pending, ""  # the collect step
        return ProgramResult(exit_code=0, stdout=out, stderr="", duration_s=0.01)


def run(agent: Agent, task: str = "do it") -> Any:
    return asyncio.run(agent.run(task))


def test_tool_calls_run_in_order_and_the_loop_stops_without_a_call(tmp_path: Path) -> None:
    model = Script(reply("a", [bash("echo one"), bash("echo two")]), reply("done"))
    rt = FakeRuntime()
    transcript = tmp_path / "t.jsonl"
    stats = run(Agent(model, rt, AgentConfig(max_turns=5), transcript=transcript))  # type: ignore[arg-type]
    assert rt.commands == ["echo one", "echo two"]
    assert (stats.turns, stats.tool_calls, stats.completion_tokens) == (2, 2, 10)
    assert stats.exit_status == "submitted" and not stats.hit_turn_cap
    # the second request carries both tool results, answered by id
    tool_msgs = [m for m in model.requests[1] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["c0", "c1"]
    assert "exit_code: 0" in tool_msgs[0]["content"] and "ran echo one" in tool_msgs[0]["content"]
    assert all("extra" not in m for m in model.requests[1])
    lines = [json.loads(x) for x in transcript.read_text().splitlines()]
    assert [m["role"] for m in lines] == ["system", "user", "assistant", "tool", "tool",
                                          "assistant", "exit"]  # fmt: skip
    assert lines[3]["extra"]["exit_code"] == 0 and lines[3]["extra"]["duration_s"] > 0
    assert lines[2]["extra"]["completion_tokens"] == 5


def test_fenced_bash_blocks_are_the_fallback() -> None:
    model = Script(reply("Let me:\n```bash\nls -la\n```\nand\n```sh\npwd\n```"), reply("ok"))
    rt = FakeRuntime()
    stats = run(Agent(model, rt, AgentConfig()))  # type: ignore[arg-type]
    assert rt.commands == ["ls -la", "pwd"]
    assert stats.tool_calls == 2 and stats.unparsed_call_turns == 0
    assert model.requests[1][-1]["role"] == "user" and "$ pwd" in model.requests[1][-1]["content"]


def test_turn_cap_truncation_and_unparsed_calls_are_counted() -> None:
    model = Script(
        reply("x", [("bash", '{"command": "ls"')]),  # malformed JSON
        reply('<tool_call>{"name": "bash", "arguments": {"command": ls}}</tool_call>'),
        reply("", [("python", "{}")]),  # no such tool
        reply("cut", [bash("echo hi")], finish="length"),
    )
    rt = FakeRuntime()
    stats = run(Agent(model, rt, AgentConfig(max_turns=6)))  # type: ignore[arg-type]
    assert stats.unparsed_call_turns == 3
    assert stats.truncated_turns == 3  # turns 4..6 repeat the last (truncated) reply
    assert stats.hit_turn_cap and stats.exit_status == "turn_cap" and stats.turns == 6
    assert rt.commands == ["echo hi"] * 3
    # every tool call in the history is answered, even the unparsed ones
    last = model.requests[-1]
    ids = {c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls", [])}
    answered = {m["tool_call_id"] for m in last if m["role"] == "tool"}
    assert ids <= answered


def test_a_runtime_that_never_returns_does_not_block_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_mod, "RUN_GRACE_S", 0.2)
    model = Script(reply("", [bash("cargo run")]), reply("done"))
    stats = run(Agent(model, FakeRuntime(hang=True), AgentConfig(command_timeout_s=0.1)))  # type: ignore[arg-type]
    assert stats.turns == 2 and stats.commands[0].timed_out
    assert "timed out" in stats.commands[0].output


def test_output_keeps_head_and_tail() -> None:
    text = "".join(f"line {i}\n" for i in range(1000))
    capped = cap_output(text, 200)
    assert capped.startswith("line 0\n") and capped.endswith("line 999\n")
    assert "characters elided" in capped and len(capped) < 300
    assert cap_output("short", 200) == "short"


def test_plain_prose_is_a_final_answer_not_a_format_error() -> None:
    assert parse_actions(reply("All done, the server works."), 1) == []


@pytest.mark.parametrize(
    "runtime_name",
    [
        "subprocess",
        pytest.param(
            "bwrap",
            marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap not installed"),
        ),
    ],
)
def test_background_process_never_blocks(runtime_name: str) -> None:
    """A background job returns at once, redirected or not (the loop sends output to a file,
    not the runtime's pipes); a foreground hang is killed at the timeout; output is capped."""
    from metrale.runtime import configs

    config = configs.runtime_config(runtime_name)
    configs.check_runtime(config)  # bwrap installed but unusable is a failure, not a skip

    async def go() -> Any:
        runtime = configs.create_runtime(config)
        await runtime.start()
        try:
            model = Script(
                reply("", [bash("setsid sleep 300 > server.log 2>&1 & echo $!")]),
                reply("", [bash("sleep 300 &")]),  # not redirected: holds the pipes
                reply("", [bash("sleep 300")]),  # foreground: the command timeout kills it
                reply("", [bash("seq 1 100000; echo oops >&2; exit 3")]),
                reply("done"),
            )
            agent = Agent(model, runtime, AgentConfig(command_timeout_s=2))  # type: ignore[arg-type]
            # A control file proves the listing below looks at the runtime's own /tmp (bwrap's
            # is private: the host's /tmp would never show the agent's files).
            await runtime.run("touch /tmp/metrale-agent-control.out", timeout=10)
            result = await agent.run("start things")
            listing = await runtime.run("ls -1 /tmp", timeout=10)
            # under subprocess /tmp is the host's: leave nothing there
            await runtime.run("rm -f /tmp/metrale-agent-control.out", timeout=10)
            return result, agent._token, set(listing.stdout.split())
        finally:
            await runtime.stop()

    stats, token, in_tmp = asyncio.run(go())
    first, second, third, fourth = stats.commands
    assert first.duration_s < 2 and not first.timed_out and first.exit_code == 0
    assert second.duration_s < 2 and not second.timed_out
    assert third.timed_out and third.duration_s < 5
    assert fourth.exit_code == 3 and "bytes elided" in fourth.output
    assert fourth.output.startswith("exit_code: 3\n1\n2\n") and fourth.output.endswith("oops\n")
    assert "metrale-agent-control.out" in in_tmp
    assert not [n for n in in_tmp if n.startswith(f"metrale-agent-{token}-")]  # collected, removed
    assert stats.exit_status == "submitted"


def test_an_endpoint_error_ends_the_run_as_data_and_is_not_a_turn() -> None:
    from metrale.endpoint.client import EndpointError

    class Failing(Script):
        async def chat(self, messages: Any, **kw: Any) -> CallRecord:
            if self.requests:
                raise EndpointError("timeout", "no complete response within 1 s")
            return await super().chat(messages, **kw)

    stats = run(Agent(Failing(reply("", [bash("ls")])), FakeRuntime(), AgentConfig()))  # type: ignore[arg-type]
    assert stats.turns == 1 and stats.tool_calls == 1
    assert stats.exit_status == "endpoint_error" and stats.error and "timeout" in stats.error
