"""Timestamped trace replay (`serve --trace FILE`): Mooncake's trace format, read and turned
into prompts whose shared blocks are shared exactly.

**The format** (Mooncake's published traces): one JSON object a line with `timestamp` (ms since
the trace began), `input_length` and `output_length` (tokens), and `hash_ids`: the ids of the
prompt's consecutive 512-token blocks, a block id standing for a block and everything before it,
so two requests sharing their first k ids share their first k·512 prompt tokens.

**The prompts.** Block id h becomes 512 tokens drawn from a generator seeded by h (words, exact
by the server's tokenizer where it has one, as serve's synthetic prompts are); a request's
prompt is one user message: its blocks' text in order, cut to `input_length` tokens (the last
block is partial when the length ends inside it), padded with words of its own when
`input_length` is longer than its blocks. Requests sharing a hash id thus send that block's
tokens exactly. `output_length` is the request's `max_tokens`.

**The timing.** Request i is intended at (timestamp_i − timestamp_0) / speed after the level
starts, open loop: it leaves at its time whatever the ones before it are doing, and its
scheduling lag (send − intended) is reported as for every open-loop load.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrale.benchmarks.serve.prompts import _VOCAB, Prompt, Tokenizer, text_of
from metrale.errors import UsageError, read_user_file

#: Tokens per hash id in Mooncake's traces.
BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceRequest:
    offset_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_trace(path: Path) -> list[TraceRequest]:
    """The trace's requests by time (stable for equal timestamps); one-line `UsageError`s."""
    text = read_user_file(path, "trace file")
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise UsageError(f"trace file {path} line {n} is not JSON") from None
        rows.append(_row(row, f"trace file {path} line {n}"))
    if not rows:
        raise UsageError(f"trace file {path} has no requests")
    rows.sort(key=lambda r: r[0])
    start = rows[0][0]
    return [TraceRequest((t - start) / 1000.0, i, o, h) for t, i, o, h in rows]


def _row(row: Any, where: str) -> tuple[float, int, int, tuple[int, ...]]:
    accepted = (
        "accepted: an object with timestamp (ms), input_length and output_length (tokens, >= 1) "
        "and hash_ids (a list of integers)"
    )
    if not isinstance(row, dict):
        raise UsageError(f"{where}: not an object; {accepted}")
    t, i, o, h = (row.get(k) for k in ("timestamp", "input_length", "output_length", "hash_ids"))
    if not (
        isinstance(t, int | float) and not isinstance(t, bool) and 0 <= t < float("inf")
        and _count(i) and _count(o) and isinstance(h, list) and all(_count(x) for x in h)
    ):  # fmt: skip
        raise UsageError(f"{where}: {accepted}")
    assert isinstance(i, int) and isinstance(o, int)
    if i < 1 or o < 1:
        raise UsageError(f"{where}: {accepted}")
    return float(t), i, o, tuple(h)


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def block_words(hash_id: int, extra: int = 0) -> list[str]:
    """The words block `hash_id` is made of (seeded by it; `extra` more to cut from)."""
    rng = random.Random(f"trace-block-{hash_id}")
    return [f"b{hash_id}:"] + [rng.choice(_VOCAB) for _ in range(BLOCK_TOKENS - 1 + extra)]


async def trace_prompts(requests: list[TraceRequest], tokenizer: Tokenizer | None) -> list[Prompt]:
    """Each request's prompt (module docstring); blocks are built once per (id, length)."""
    exact = tokenizer if tokenizer is not None and tokenizer.available else None
    blocks: dict[tuple[int, int], str] = {}

    async def block(h: int, tokens: int) -> str:
        key = (h, tokens)
        if key not in blocks:
            blocks[key] = await text_of(block_words(h, extra=BLOCK_TOKENS + 8), tokens, exact)
        return blocks[key]

    prompts = []
    for n, req in enumerate(requests):
        parts: list[str] = []
        left = req.input_length
        for h in req.hash_ids:
            if left <= 0:
                break
            take = min(BLOCK_TOKENS, left)
            parts.append(await block(h, take))
            left -= take
        if left > 0:
            rng = random.Random(f"trace-pad-{n}")
            words = [f"r{n}:"] + [rng.choice(_VOCAB) for _ in range(2 * left + 8)]
            parts.append(await text_of(words, left, exact))
        prompts.append(Prompt([{"role": "user", "content": " ".join(parts)}], req.output_length))
    return prompts
