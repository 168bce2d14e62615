"""The multi-turn shell agent loop and its transcript, reusable by every agentic benchmark.

The shape follows mini-swe-agent: the message list *is* the trajectory; each message may carry
an `extra` dict (timings, tokens, exit codes) that is saved with it and stripped before the
message is sent; limits end the loop through small exceptions. One turn = one chat call.

- The model gets one tool, `bash(command)`, through OpenAI tool calling. Where the reply has no
  tool calls, fenced ```bash blocks in its content are run instead, in order.
- Every command runs in the `Runtime` (never here) as `bash -c` with `command_timeout_s`. Its
  stdout and stderr go to a file in the sandbox's /tmp, collected by a second short command with
  head and tail kept past `output_cap_chars`: a job it leaves in the background (`cargo run &`,
  redirected or not) holds that file, never the runtime's pipes, so `run()` returns when the
  shell exits. A command that outlives its timeout is killed by the runtime; a runtime that does
  not return within timeout + `RUN_GRACE_S` is abandoned. Nothing the agent starts can block
  the loop.
- The loop stops when a reply calls no tool and has no bash block (`Submitted`), or when
  `max_turns` replies have been taken (`LimitsExceeded`; `hit_turn_cap`).

Counters (`AgentStats`): **turns** = chat calls answered; **tool_calls** = commands run (tool
calls and fenced blocks); **completion_tokens** = sum over turns of the call's completion
tokens; **truncated_turns** = turns whose finish_reason is "length" (cut by `max_tokens`);
**unparsed_call_turns** = turns where the model tried to call a tool and no call could be parsed
(a tool call with another name, arguments that are not a JSON object with a string `command`,
or tool-call markup such as `<tool_call>` left in the content with no bash block to run);
**wall_s** = loop start to loop end, monotonic.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from metrale.endpoint.client import CallRecord, EndpointError
from metrale.runtime.base import ProgramResult, Runtime

#: Seconds past a command's timeout after which the loop stops waiting for the runtime.
RUN_GRACE_S = 10.0
#: Prints a command's output file (head and tail when over the cap, in bytes) and removes it.
_COLLECT = (
    'f=$1; cap=$2; size=$(stat -c %s "$f" 2>/dev/null || echo 0)\n'
    'if [ "$size" -le "$cap" ]; then cat "$f" 2>/dev/null\n'
    'else half=$((cap / 2)); head -c "$half" "$f"\n'
    '  printf "\\n[... %s bytes elided ...]\\n" "$((size - 2 * half))"; tail -c "$half" "$f"; fi\n'
    'rm -f "$f"'
)

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run one bash command in the working directory and return its exit code "
        "and output. Each call is a fresh shell; the working directory persists.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command to run"}},
            "required": ["command"],
        },
    },
}

DEFAULT_SYSTEM_PROMPT = (
    "You are a software engineer working in a Linux shell. Use the bash tool to run commands, "
    "one command per call; you will see each command's exit code and output. Work step by step "
    "until the task is done, then reply with a short summary and no tool call."
)

_FENCE = re.compile(r"```(?:bash|sh|shell)[ \t]*\n(.*?)```", re.DOTALL)
_CALL_MARKUP = re.compile(
    r"<tool_call>|<function[=>]|<\|tool_call|\"name\"\s*:\s*\"bash\"|\[TOOL_CALLS\]"
)


class Chat(Protocol):
    """What the loop needs of a model: `ChatClient.chat` satisfies it."""

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> CallRecord: ...


class AgentConfig(BaseModel):
    max_turns: int = 30
    command_timeout_s: float = 120.0
    output_cap_chars: int = 10_000
    max_tokens: int | None = 4096
    temperature: float | None = None
    system_prompt: str = DEFAULT_SYSTEM_PROMPT


class CommandRecord(BaseModel):
    """One command the agent ran."""

    turn: int
    source: str  # "tool" or "fence"
    command: str
    exit_code: int
    timed_out: bool = False
    duration_s: float
    output: str


@dataclass
class AgentStats:
    turns: int = 0
    tool_calls: int = 0
    completion_tokens: int = 0
    hit_turn_cap: bool = False
    truncated_turns: int = 0
    unparsed_call_turns: int = 0
    wall_s: float = 0.0
    exit_status: str = ""
    error: str | None = None
    commands: list[CommandRecord] = field(default_factory=list)

    def record_metrics(self) -> dict[str, Any]:
        """The loop's numbers under the keys every agentic benchmark's records use (turns and
        completion tokens have fields of their own on the record)."""
        return {
            "agent_wall_s": self.wall_s,
            "tool_calls": self.tool_calls,
            "hit_turn_cap": self.hit_turn_cap,
            "truncated_turns": self.truncated_turns,
            "unparsed_call_turns": self.unparsed_call_turns,
            "timed_out_commands": sum(1 for c in self.commands if c.timed_out),
            "exit_status": self.exit_status,
            "agent_error": self.error,
        }


class AgentStop(Exception):
    """Ends the loop; `exit_status` names why."""

    exit_status = "stopped"


class Submitted(AgentStop):
    exit_status = "submitted"


class LimitsExceeded(AgentStop):
    exit_status = "turn_cap"


class FormatError(Exception):
    """The model tried to call a tool and the call could not be parsed."""


@dataclass
class Action:
    command: str
    source: str
    call_id: str | None = None


def cap_output(text: str, cap: int) -> str:
    """Keep the first and last `cap // 2` characters of `text`, naming what was elided."""
    if len(text) <= cap:
        return text
    half = cap // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters elided ...]\n{text[-half:]}"


def parse_actions(call: CallRecord, turn: int) -> list[Action]:
    """The commands a reply asks for; raises `FormatError` when it tried to call and failed."""
    if call.tool_calls:
        actions: list[Action] = []
        problems: list[str] = []
        for i, tc in enumerate(call.tool_calls):
            call_id = tc.id or f"call_{turn}_{i}"
            if tc.name != "bash":
                problems.append(f"unknown tool {tc.name!r} (the only tool is 'bash')")
                continue
            try:
                args = json.loads(tc.arguments or "{}")
            except ValueError:
                problems.append(f"arguments are not JSON: {tc.arguments[:200]!r}")
                continue
            command = args.get("command") if isinstance(args, dict) else None
            if not isinstance(command, str) or not command.strip():
                problems.append(f"arguments lack a string 'command': {tc.arguments[:200]!r}")
                continue
            actions.append(Action(command, "tool", call_id))
        if problems and not actions:
            raise FormatError("; ".join(problems))
        return actions
    blocks = [b.strip() for b in _FENCE.findall(call.content or "") if b.strip()]
    if blocks:
        return [Action(b, "fence") for b in blocks]
    if _CALL_MARKUP.search(call.content or ""):
        raise FormatError("the reply contains tool-call markup that is not a parseable tool call")
    return []


def _observation(result: ProgramResult, timeout_s: float, output: str) -> str:
    parts = [f"exit_code: {result.exit_code}"]
    if result.timed_out:
        parts.append(f"[the command timed out after {timeout_s:g} s and was killed]")
    parts.append(output or "(no output)")
    return "\n".join(parts)


class Agent:
    """One agent run: `await Agent(...).run(task)` returns its stats; `messages` is the trajectory.

    `transcript` (a path) gets one JSON line per message as it is added, flushed at once, so a
    crash keeps every finished step.
    """

    def __init__(
        self,
        model: Chat,
        runtime: Runtime,
        config: AgentConfig,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        transcript: Path | None = None,
    ) -> None:
        self.model, self.runtime, self.config = model, runtime, config
        self.env = dict(env or {})
        self.cwd = cwd
        self.transcript = transcript
        self.messages: list[dict[str, Any]] = []
        self.stats = AgentStats()
        self._token = uuid.uuid4().hex[:12]
        self._outputs = 0
        if transcript is not None:
            transcript.parent.mkdir(parents=True, exist_ok=True)
            transcript.write_text("")

    def add(self, *messages: dict[str, Any]) -> None:
        self.messages.extend(messages)
        if self.transcript is not None:
            with self.transcript.open("a", encoding="utf-8") as f:
                for m in messages:
                    f.write(json.dumps(m, default=str) + "\n")

    async def run(self, task: str) -> AgentStats:
        """Run turns until the model stops calling tools or the cap; endpoint errors are data."""
        started = time.perf_counter()
        self.add(
            {"role": "system", "content": self.config.system_prompt},
            {"role": "user", "content": task},
        )
        try:
            while True:
                await self.step()
        except AgentStop as stop:
            self.stats.exit_status = stop.exit_status
            self.add({"role": "exit", "content": str(stop), "extra": {"exit": stop.exit_status}})
        except EndpointError as exc:
            self.stats.exit_status = "endpoint_error"
            self.stats.error = f"{exc.kind}: {exc}"
            self.add({"role": "exit", "content": str(exc), "extra": {"exit": "endpoint_error"}})
        finally:
            self.stats.wall_s = time.perf_counter() - started
        return self.stats

    async def step(self) -> None:
        if self.stats.turns >= self.config.max_turns:
            self.stats.hit_turn_cap = True
            raise LimitsExceeded(f"turn cap of {self.config.max_turns} reached")
        call = await self.query()
        turn = self.stats.turns
        try:
            actions = parse_actions(call, turn)
        except FormatError as exc:
            self.stats.unparsed_call_turns += 1
            self._add_reply(call, [])
            self.add({
                "role": "user",
                "content": f"Your tool call could not be parsed ({exc}). Call the bash tool "
                'with JSON arguments {"command": "..."}, or put the command in a ```bash block.',
                "extra": {"turn": turn, "format_error": str(exc)},
            })  # fmt: skip
            return
        self._add_reply(call, actions)
        if not actions:
            raise Submitted("the model called no tool")
        for action in actions:
            await self.execute(action, turn)

    async def query(self) -> CallRecord:
        sendable = [{k: v for k, v in m.items() if k != "extra"} for m in self.messages]
        sendable = [m for m in sendable if m["role"] != "exit"]
        call = await self.model.chat(
            sendable,
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
            tools=[BASH_TOOL],
        )
        self.stats.turns += 1
        self.stats.completion_tokens += call.completion_tokens or 0
        if call.finish_reason == "length":
            self.stats.truncated_turns += 1
        return call

    def _add_reply(self, call: CallRecord, actions: list[Action]) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": call.content or None}
        if call.tool_calls:
            message["tool_calls"] = [
                {
                    "id": tc.id or f"call_{self.stats.turns}_{i}",
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments},
                }
                for i, tc in enumerate(call.tool_calls)
            ]
        if message["content"] is None and "tool_calls" not in message:
            message["content"] = ""
        message["extra"] = {
            "turn": self.stats.turns,
            "finish_reason": call.finish_reason,
            "completion_tokens": call.completion_tokens,
            "prompt_tokens": call.prompt_tokens,
            "ttft_s": call.ttft_s,
            "latency_s": call.latency_s,
            "reasoning": call.reasoning or None,
            "actions": len(actions),
        }
        self.add(message)
        # A tool call that was not run still needs an answer, or the next request is invalid.
        ran = {a.call_id for a in actions}
        for tc in message.get("tool_calls", []):
            if tc["id"] not in ran:
                self.add({
                    "role": "tool",
                    "tool_call_id": tc["id"],
                    "content": "not run: the only tool is bash(command)",
                    "extra": {"turn": self.stats.turns, "skipped": True},
                })  # fmt: skip

    async def execute(self, action: Action, turn: int) -> None:
        """Run one command with its output going to a file in the sandbox, not to the runtime's
        pipes, so a job it leaves in the background cannot hold `run()` open; then collect
        that file (capped, head and tail) with a second, short command."""
        timeout = self.config.command_timeout_s
        started = time.perf_counter()
        self._outputs += 1
        out_file = f"/tmp/metrale-agent-{self._token}-{self._outputs}.out"
        script = f"exec >{out_file} 2>&1 </dev/null\n{action.command}"
        try:
            result = await asyncio.wait_for(
                self.runtime.run(["bash", "-c", script], env=self.env, cwd=self.cwd,
                                 timeout=timeout),
                timeout + RUN_GRACE_S,
            )  # fmt: skip
        except TimeoutError:
            result = ProgramResult(exit_code=-9, stdout="", stderr="", timed_out=True)
        result.duration_s = result.duration_s or time.perf_counter() - started
        cap = str(self.config.output_cap_chars)
        try:
            collected = await asyncio.wait_for(
                self.runtime.run(["bash", "-c", _COLLECT, "collect", out_file, cap],
                                 env=self.env, cwd=self.cwd, timeout=30),
                30 + RUN_GRACE_S,
            )  # fmt: skip
            captured = collected.stdout
        except TimeoutError:
            captured = "[the output could not be collected]"
        # anything on the pipes came before the redirect (e.g. the runtime's own errors)
        early = cap_output(result.stdout + result.stderr, self.config.output_cap_chars)
        output = _observation(result, timeout, early + captured)
        record = CommandRecord(
            turn=turn,
            source=action.source,
            command=action.command,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            duration_s=result.duration_s,
            output=output,
        )
        self.stats.commands.append(record)
        self.stats.tool_calls += 1
        extra = record.model_dump(exclude={"output"})
        if action.source == "tool":
            self.add({
                "role": "tool", "tool_call_id": action.call_id, "content": output, "extra": extra,
            })  # fmt: skip
        else:
            self.add({"role": "user", "content": f"$ {action.command}\n{output}", "extra": extra})
