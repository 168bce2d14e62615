"""The simulator's serving model: decoding slots and their queue, prefill time, an LRU prefix
cache, tool calls in replies, and the counters its `/metrics` page shows.

One model for every workload (independent requests, sessions, traces), deterministic so that
a test can compute by hand what a load against it must measure. Per request, from the moment it
takes a slot (its **admission**, in arrival order):

- **slots**: at most `max_running` requests hold a slot from admission to their last token; the
  rest wait in arrival order (`num_requests_waiting`). Slots do not slow each other down.
- **prefix cache**: at admission the prompt's leading full blocks found in the cache are its
  cached tokens (`usage.prompt_tokens_details.cached_tokens`); then every full block of the
  prompt is stored, the least recently used blocks evicted beyond `prefix_cache_tokens`.
  Blocks and tokens follow `metrale.prefix` (the same rule as metrale's ideal hit rate).
- **first token** at admission + `ttft_s` + `prefill_s_per_token` x (prompt − cached tokens);
  each further token `itl_s` after the one before.

So a request of u uncached prompt tokens and n output tokens holds its slot for
S = ttft_s + prefill_s_per_token·u + itl_s·(n − 1); the capacity formulas built on S are in
docs/benchmarks/serve.md ("The simulator's serving model").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from metrale.prefix import DEFAULT_BLOCK, block_hashes


class PrefixCache:
    """An LRU cache of prompt blocks, `capacity_tokens` in size (whole blocks)."""

    def __init__(self, capacity_tokens: int, block: int = DEFAULT_BLOCK) -> None:
        self.block = block
        self.capacity_blocks = capacity_tokens // block
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def admit(self, tokens: Sequence[object]) -> int:
        """The cached tokens of this prompt; then store its blocks (most recent last)."""
        names = block_hashes(tokens, self.block)
        hits = 0
        for name in names:
            if name not in self._blocks:
                break
            hits += 1
        for name in names:
            self._blocks[name] = None
            self._blocks.move_to_end(name)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        return hits * self.block

    @property
    def used_tokens(self) -> int:
        return len(self._blocks) * self.block


@dataclass
class Admission:
    """What the model decided for one request when it took its slot."""

    prompt_tokens: int
    cached_tokens: int
    #: seconds from admission to the first token: ttft_s + prefill of the uncached tokens
    first_token_s: float
    #: whether the request queued for a slot (all slots were held when it arrived)
    waited: bool = False


@dataclass
class Counters:
    """The running totals behind `/metrics` (and `/sim/stats`)."""

    running: int = 0
    waiting: int = 0
    #: prompt tokens looked up in the prefix cache, and those found (vLLM's prefix_cache_*)
    prefix_queries: int = 0
    prefix_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_done: int = 0
    #: prompt + output tokens reserved by the running requests (their KV cache)
    kv_tokens: int = 0


class ServingModel:
    """Slots, queue, prefix cache and counters of one simulator (module docstring)."""

    def __init__(
        self,
        *,
        max_running: int | None,
        ttft_s: float,
        prefill_s_per_token: float,
        prefix_cache_tokens: int,
        block: int = DEFAULT_BLOCK,
    ) -> None:
        self._slots = asyncio.Semaphore(max_running) if max_running else None
        self.ttft_s = ttft_s
        self.prefill_s_per_token = prefill_s_per_token
        self.cache = PrefixCache(prefix_cache_tokens, block) if prefix_cache_tokens else None
        self.kv_capacity_tokens = prefix_cache_tokens
        self.counters = Counters()

    @contextlib.asynccontextmanager
    async def admitted(self, tokens: Sequence[object], max_output: int) -> AsyncIterator[Admission]:
        """Wait for a slot (queued in arrival order), hold it for the body of the `with`."""
        c = self.counters
        waited = self._slots is not None and self._slots.locked()
        c.waiting += 1
        try:
            if self._slots is not None:
                await self._slots.acquire()
        finally:
            c.waiting -= 1
        cached = self.cache.admit(tokens) if self.cache is not None else 0
        reserved = len(tokens) + max_output
        c.running += 1
        c.kv_tokens += reserved
        c.prefix_queries += len(tokens)
        c.prefix_hits += cached
        c.prompt_tokens += len(tokens)
        uncached = len(tokens) - cached
        try:
            first_token_s = self.ttft_s + self.prefill_s_per_token * uncached
            yield Admission(len(tokens), cached, first_token_s, waited)
        finally:
            c.running -= 1
            c.kv_tokens -= reserved
            c.requests_done += 1
            if self._slots is not None:
                self._slots.release()

    def generated(self, tokens: int) -> None:
        self.counters.generation_tokens += tokens

    @property
    def kv_usage(self) -> float:
        """The running requests' reserved tokens over the KV pool (`prefix_cache_tokens`), at
        most 1; 0 without a pool. vLLM's `kv_cache_usage_perc` (a fraction, despite the name)."""
        if not self.kv_capacity_tokens:
            return 0.0
        return min(1.0, self.counters.kv_tokens / self.kv_capacity_tokens)


# --- tool calls -------------------------------------------------------------------------------


def wants_tool_call(body: dict[str, Any], tool_turns: int | None) -> dict[str, Any] | None:
    """The tool the reply calls, or None for a text reply.

    The rule: a request whose `tools` is a non-empty list (and whose `tool_choice` is not
    "none") is answered with a call of its **first** tool, unless `tool_turns` is set and the
    conversation already holds that many `tool` messages after its last `user` message (then
    the reply is text, so that an agent loop ends).
    """
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    first = tools[0]
    if not isinstance(first, dict) or not isinstance(first.get("function"), dict):
        return None
    if tool_turns is not None:
        since_user = 0
        for m in body.get("messages") or ():
            role = m.get("role") if isinstance(m, dict) else None
            since_user = 0 if role == "user" else since_user + (role == "tool")
        if since_user >= tool_turns:
            return None
    fn: dict[str, Any] = first["function"]
    return fn


def argument_name(fn: dict[str, Any]) -> str | None:
    """The parameter the reply's text goes to: the first `required` one, else the first
    property, else none (arguments `{}`)."""
    params = fn.get("parameters")
    if not isinstance(params, dict):
        return None
    required = params.get("required")
    if isinstance(required, list) and required and isinstance(required[0], str):
        return required[0]
    props = params.get("properties")
    if isinstance(props, dict) and props:
        return str(next(iter(props)))
    return None


def argument_pieces(fn: dict[str, Any], pieces: Sequence[str]) -> list[str]:
    """The call's JSON arguments cut in one piece per output token: `{"<param>": "<reply>"}`,
    the reply being the output tokens joined (trailing space dropped). Joined, the pieces are the
    whole arguments string; streamed, one piece goes in each token's chunk."""
    name = argument_name(fn)
    if name is None or not pieces:
        return ["{}"] + [""] * (len(pieces) - 1) if pieces else ["{}"]
    text = list(pieces)
    text[-1] = text[-1].rstrip()
    escaped = [orjson.dumps(p).decode()[1:-1] for p in text]
    escaped[0] = "{" + orjson.dumps(name).decode() + ': "' + escaped[0]
    escaped[-1] += '"}'
    return escaped
