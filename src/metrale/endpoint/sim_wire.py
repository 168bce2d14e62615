"""The simulator's wire format: OpenAI chat-completion chunks and tool calls, as bytes."""

from __future__ import annotations

from typing import Any

import orjson


def frame(created: int, model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    chunk = {
        "id": "chatcmpl-sim",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def usage_frame(created: int, model: str, usage: dict[str, Any]) -> bytes:
    chunk = {
        "id": "chatcmpl-sim",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def tool_call(call_id: str, fn: dict[str, Any], arguments: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": fn.get("name", ""), "arguments": arguments},
    }


def delta_call(i: int, call_id: str, fn: dict[str, Any], piece: str) -> dict[str, Any]:
    """A streamed tool call's piece: the first carries its id and name, as OpenAI's do."""
    if i == 0:
        return {"index": 0, **tool_call(call_id, fn, piece)}
    return {"index": 0, "function": {"arguments": piece}}
