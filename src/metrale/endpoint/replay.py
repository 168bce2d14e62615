"""Recorded assistant turns for `metrale sim --replay FILE`: agent runs reproducible with no model.

File format: JSONL, one assistant turn per line, in order:

    {"content": "text or null", "tool_calls": [{"id": "call_1", "name": "bash",
     "arguments": {"command": "ls"}}], "finish_reason": "tool_calls", "completion_tokens": 12}

Every key is optional. `arguments` is an object (sent JSON-encoded) or a string (sent verbatim,
so a malformed call can be recorded). `finish_reason` defaults to "tool_calls" when the turn has
tool calls, else "stop". `completion_tokens` defaults to the whitespace-separated words of the
content and arguments. Lines that are blank or start with `#` are skipped.

Keying: a request is one conversation's next turn, and its turn number is the number of
assistant messages already in the request. Request n gets line n; past the end, the last line
again (a last line that calls a tool therefore repeats until the agent's turn cap). No state is
kept, so any number of conversations, in parallel or one after another, replay the same file.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError, field_validator

from metrale.errors import UsageError, read_user_file


class ReplayCall(BaseModel):
    id: str = ""
    name: str = "bash"
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _encode(cls, value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)


class ReplayTurn(BaseModel):
    content: str | None = None
    tool_calls: list[ReplayCall] = Field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None

    def finish(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")

    def tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        text = (self.content or "") + " ".join(c.arguments for c in self.tool_calls)
        return max(1, len(text.split()))


def load_replay(path: Path) -> list[ReplayTurn]:
    """Parse a replay file; `UsageError` naming the line on any problem."""
    text = read_user_file(path, "replay file")
    turns: list[ReplayTurn] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            turns.append(ReplayTurn.model_validate_json(line))
        except ValidationError as exc:
            first = exc.errors()[0]
            raise UsageError(
                f"replay file {path} line {n}: {first['msg']} at {first.get('loc')}"
            ) from None
    if not turns:
        raise UsageError(f"replay file {path} has no turns")
    return turns


def turn_for(turns: list[ReplayTurn], messages: object) -> tuple[int, ReplayTurn]:
    """The turn a request gets: its count of assistant messages, capped at the last line."""
    done = 0
    if isinstance(messages, list):
        done = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    index = min(done, len(turns) - 1)
    return index, turns[index]


def stream_deltas(turn: ReplayTurn, index: int) -> list[dict[str, Any]]:
    """The streamed `delta`s of a turn: content word by word, then each tool call in two parts."""
    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    if turn.content:
        words = turn.content.split(" ")
        deltas += [{"content": w if i == len(words) - 1 else w + " "} for i, w in enumerate(words)]
    for i, call in enumerate(turn.tool_calls):
        call_id = call.id or f"call_replay_{index}_{i}"
        head = {"index": i, "id": call_id, "type": "function", "function": {"name": call.name}}
        deltas.append({"tool_calls": [head]})
        deltas.append({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]})
    return deltas


def message(turn: ReplayTurn, index: int) -> dict[str, Any]:
    """The non-streamed `message` of a turn."""
    out: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id or f"call_replay_{index}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(turn.tool_calls)
        ]
    return out


def _chunk(model: str, created: int, choices: list[Any], **extra: Any) -> bytes:
    body = {"id": "chatcmpl-replay", "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": choices, **extra}  # fmt: skip
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def serve_turn(
    request: web.Request,
    body: dict[str, Any],
    turns: list[ReplayTurn],
    *,
    model: str,
    ttft_s: float = 0.0,
    usage: bool = True,
) -> web.StreamResponse:
    """Answer one chat request with its recorded turn, streamed or not as the request asks."""
    index, turn = turn_for(turns, body.get("messages"))
    prompt = sum(
        len(str(m.get("content") or "").split())
        for m in body.get("messages") or ()
        if isinstance(m, dict)
    )
    counts = {"prompt_tokens": prompt, "completion_tokens": turn.tokens(),
              "total_tokens": prompt + turn.tokens()}  # fmt: skip
    created = int(time.time())
    if ttft_s > 0:
        await asyncio.sleep(ttft_s)
    if not body.get("stream"):
        out: dict[str, Any] = {
            "id": "chatcmpl-replay", "object": "chat.completion", "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message(turn, index),
                         "finish_reason": turn.finish()}],
        }  # fmt: skip
        if usage:
            out["usage"] = counts
        return web.json_response(out)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    frames = [
        _chunk(model, created, [{"index": 0, "delta": d, "finish_reason": None}])
        for d in stream_deltas(turn, index)
    ]
    frames.append(_chunk(model, created, [{"index": 0, "delta": {},
                                           "finish_reason": turn.finish()}]))  # fmt: skip
    if usage and (body.get("stream_options") or {}).get("include_usage"):
        frames.append(_chunk(model, created, [], usage=counts))
    frames.append(b"data: [DONE]\n\n")
    await resp.write(b"".join(frames))
    await resp.write_eof()
    return resp
