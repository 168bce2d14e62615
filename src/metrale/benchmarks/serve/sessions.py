"""Sessions as load: what one agent's conversation sends, turn by turn, from three sources.

A **session** is one agent's conversation: its messages (system prompt, user task, then each
assistant reply with its `tool_calls` and each tool result) and its **turns**, one chat call
each. Turn i sends the session's first `upto` messages with the `tools` schema, after `tool_s`
seconds of tool (or think) time. A session keeps one list of messages; each turn sends a prefix
of it, so its memory is its messages, never a copy per turn.

Sources, one shape (`Session`):

- **synthetic** (`SyntheticSessions`): a shared system prompt of `system_tokens` words, a user
  task opened by the session's id (its cache-busting marker: sessions share the system prompt
  and nothing after it), then per turn an assistant `bash` tool call and a tool result of
  `turn_tokens` words; tool time drawn from `ToolTime`. Session k is a function of (seed, k)
  alone. Words stand for tokens: exact on `metrale sim` (it counts words), approximate elsewhere.
- **recorded** (`load_sessions`): the JSONL session format of docs/benchmarks/serve.md (one
  session a line: `id`, `messages`, optional `tools`), or the transcripts agentic_webserver and
  terminal_bench keep (`transcripts/<i>.jsonl` in their run directory: one message a line, the
  tool time in each tool message's `extra.duration_s`). Each assistant message is a turn: the
  request is every message before it; its `max_tokens` is the reply's recorded completion
  tokens. Replaying sends byte-identical bodies (bodies are encoded from these messages only).

The server's replies are measured, not fed back: what the next turn sends is the recording.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from metrale.errors import UsageError, read_user_file

#: Keys of a recorded message that describe it and are not sent.
_META_KEYS = ("extra", "tool_s", "max_tokens")
_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "build",
    "test",
    "file",
    "line",
    "error",
    "value",
    "import",
    "module",
    "return",
    "class",
    "function",
    "output",
    "input",
    "result",
    "cache",
    "server",
    "client",
    "request",
    "queue",
    "token",
    "batch",
    "stream",
    "shell",
    "command",
    "status",
    "patch",
    "commit",
    "branch",
]


@dataclass(frozen=True, slots=True)
class Turn:
    """One chat call: it sends `messages[:upto]`, `tool_s` seconds after the previous one ended."""

    upto: int
    tool_s: float = 0.0
    max_tokens: int | None = None


@dataclass(slots=True)
class Session:
    id: str
    messages: list[dict[str, Any]]
    turns: list[Turn]
    tools: list[dict[str, Any]] | None = None


class SessionSource(Protocol):
    """Session number k of a run (k counts sessions in the order lanes start them)."""

    def session(self, k: int) -> Session: ...


@dataclass(frozen=True)
class ToolTime:
    """Tool time between turns: `const:S`, `exp:MEAN`, `uniform:LO:HI` (seconds)."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> ToolTime:
        kind, _, rest = text.strip().partition(":")
        accepted = "accepted: const:S, exp:MEAN, uniform:LO:HI (seconds)"
        try:
            args = [float(x) for x in rest.split(":")] if rest else []
        except ValueError:
            raise UsageError(f"tool_time {text!r}: not numbers; {accepted}") from None
        want = {"const": 1, "exp": 1, "uniform": 2}.get(kind)
        if want is None or len(args) != want:
            raise UsageError(f"tool_time {text!r}: {accepted}")
        if any(not math.isfinite(x) or x < 0 for x in args) or (want == 2 and args[1] < args[0]):
            raise UsageError(f"tool_time {text!r}: seconds must be >= 0 (and LO <= HI)")
        return cls(kind, *args)

    def draw(self, rng: random.Random) -> float:
        if self.kind == "const":
            return self.a
        if self.kind == "exp":
            return rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        return rng.uniform(self.a, self.b)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


@dataclass(frozen=True)
class SyntheticSessions:
    """Sessions of `turns` turns; each turn adds an assistant tool call and `turn_tokens` words."""

    turns: int
    turn_tokens: int
    system_tokens: int
    tool_time: ToolTime
    seed: int = 0

    @cached_property
    def system_prompt(self) -> str:
        """One string shared by every session (the prefix a server can cache)."""
        return _words(random.Random(f"system:{self.seed}"), self.system_tokens)

    def session(self, k: int) -> Session:
        rng = random.Random(f"session:{self.seed}:{k}")
        sid = f"s{k}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": f"[session {sid}] {_words(rng, self.turn_tokens)}"},
        ]
        turns = [Turn(upto=2)]
        for t in range(1, self.turns):
            call_id = f"call_{t}"
            command = json.dumps({"command": f"step {t}: {_words(rng, 4)}"})
            messages.append({
                "role": "assistant", "content": None,
                "tool_calls": [{"id": call_id, "type": "function",
                                "function": {"name": "bash", "arguments": command}}],
            })  # fmt: skip
            messages.append({
                "role": "tool", "tool_call_id": call_id,
                "content": f"exit_code: 0\n{_words(rng, self.turn_tokens)}",
            })  # fmt: skip
            turns.append(Turn(upto=len(messages), tool_s=self.tool_time.draw(rng)))
        return Session(sid, messages, turns)


@dataclass(frozen=True)
class RecordedSessions:
    """Recorded sessions, used in turn; with `marker`, session k's first user message is opened
    by `[session k]` so that two lanes replaying one recording do not share a cached prefix."""

    sessions: Sequence[Session]
    marker: bool = True

    def session(self, k: int) -> Session:
        base = self.sessions[k % len(self.sessions)]
        sid = f"{base.id}#{k}"
        if not self.marker:
            return Session(sid, base.messages, base.turns, base.tools)
        messages = list(base.messages)
        for i, m in enumerate(messages):
            if m.get("role") == "user" and isinstance(m.get("content"), str):
                messages[i] = {**m, "content": f"[session {k}] {m['content']}"}
                break
        return Session(sid, messages, base.turns, base.tools)


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


def session_from_messages(
    sid: str, raw: Sequence[object], tools: list[dict[str, Any]] | None, where: str
) -> Session:
    """A session from recorded messages (the session format's or an agent transcript's)."""
    messages: list[dict[str, Any]] = []
    turns: list[Turn] = []
    tool_s = 0.0
    for n, m in enumerate(raw, 1):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise UsageError(f"{where}: message {n} is not an object with a 'role' string")
        if m["role"] == "exit":  # the agent loop's own end marker, never sent
            continue
        extra: dict[str, Any] = m["extra"] if isinstance(m.get("extra"), dict) else {}
        if m["role"] == "assistant":
            limit = m.get("max_tokens", extra.get("completion_tokens"))
            max_tokens = limit if isinstance(limit, int) and limit > 0 else None
            if messages:
                turns.append(Turn(upto=len(messages), tool_s=tool_s, max_tokens=max_tokens))
            tool_s = 0.0
        else:
            tool_s += _number(m.get("tool_s", extra.get("duration_s")))
        messages.append({k: v for k, v in m.items() if k not in _META_KEYS})
    if not turns:
        raise UsageError(f"{where}: no assistant message, so no turn to send")
    return Session(sid, messages, turns, tools)


def load_sessions(path: Path) -> list[Session]:
    """Sessions from a session-format JSONL file, an agent transcript, or a directory of
    transcripts (a run directory's `transcripts/`); one `UsageError` line otherwise."""
    if path.is_dir():
        folder = path / "transcripts" if (path / "transcripts").is_dir() else path
        files = sorted(folder.glob("*.jsonl"), key=lambda p: (len(p.stem), p.stem))
        if not files:
            raise UsageError(f"sessions {path}: no transcripts (*.jsonl) in {folder}")
        return [s for f in files for s in _load_file(f)]
    return _load_file(path)


def _load_file(path: Path) -> list[Session]:
    text = read_user_file(path, "sessions file")
    rows: list[Any] = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise UsageError(f"sessions file {path} line {n} is not JSON") from None
    if not rows:
        raise UsageError(f"sessions file {path} is empty")
    if all(isinstance(r, dict) and "role" in r for r in rows):  # an agent transcript
        return [session_from_messages(path.stem, rows, None, f"transcript {path}")]
    sessions = []
    for n, row in enumerate(rows, 1):
        where = f"sessions file {path} line {n}"
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise UsageError(f"{where}: expected an object with 'messages' (a list)")
        tools = row.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise UsageError(f"{where}: 'tools' must be a list of tool schemas")
        sid = str(row.get("id", f"{path.stem}-{n}"))
        sessions.append(session_from_messages(sid, row["messages"], tools, where))
    return sessions


def session_source(values: Mapping[str, Any]) -> SessionSource:
    """The source serve's parameters name: `synthetic`, or recorded sessions from a path."""
    if values["session_source"] == "synthetic":
        return SyntheticSessions(
            turns=values["turns"], turn_tokens=values["turn_tokens"],
            system_tokens=values["system_tokens"], tool_time=ToolTime.parse(values["tool_time"]),
            seed=values["seed"],
        )  # fmt: skip
    return RecordedSessions(load_sessions(Path(values["session_source"])), values["session_marker"])
