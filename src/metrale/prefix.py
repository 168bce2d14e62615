"""Prompt prefixes as blocks: the one rule shared by the simulator's prefix cache and metrale's
ideal hit rate, so that "the cache served what a perfect cache would" can be checked exactly.

**Tokens.** A chat request's prompt tokens are the whitespace-separated words of its messages in
order (`message_words`): each message's text content (a string, or the `text` of its parts), then
each of its tool calls' function name and arguments. This is the simulator's tokenizer (its usage
and `/tokenize` count the same words); against a real server it is a stand-in whose shared
fraction is close to the server's own, since prefixes are shared whole messages at a time.

**Blocks.** Like vLLM's and SGLang's caches, a prefix is cached in whole blocks of `block`
tokens (16 by default): block i is named by a hash of block i's tokens chained to block i-1's
name, so two prompts share block i exactly when their first (i+1)·block tokens are equal. A
prompt's last partial block is never cached, and a hit is the run of leading blocks found.

**Ideal hit rate** = Σ hit tokens / Σ prompt tokens, over the prompts in the order sent, of a cache
of unbounded size that keeps every full block it has seen (`IdealPrefixCache`): what a perfect
cache could have served; a server's own hit rate divided by it is the cache's **efficiency**.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

#: Tokens per cache block: vLLM's default block size.
DEFAULT_BLOCK = 16


def message_words(messages: object) -> list[str]:
    """The prompt tokens of a chat message list by the simulator's rule (module docstring)."""
    if not isinstance(messages, list):
        return []
    words: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        words += _content_words(m.get("content"))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                words += str(fn.get("name") or "").split()
                words += str(fn.get("arguments") or "").split()
    return words


def _content_words(content: Any) -> list[str]:
    if isinstance(content, str):
        return content.split()
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out += part["text"].split()
        return out
    return []  # None (an assistant turn that only calls tools) or anything else: no tokens


def block_hashes(tokens: Sequence[object], block: int = DEFAULT_BLOCK) -> list[bytes]:
    """The chained name of each full block of `tokens` (a prefix's identity, block by block)."""
    names: list[bytes] = []
    prev = b""
    for start in range(0, len(tokens) - block + 1, block):
        # The previous name, then each token followed by a NUL, hashed in one call: a block
        # hashed token by token cost serve ~0.4 ms a turn on the loop that sends.
        data = "\x00".join(map(str, tokens[start : start + block])).encode() + b"\x00"
        prev = hashlib.blake2b(prev + data, digest_size=16).digest()
        names.append(prev)
    return names


class IdealPrefixCache:
    """An unbounded cache of every full block seen: the best any prefix cache could do."""

    def __init__(self, block: int = DEFAULT_BLOCK) -> None:
        if block < 1:
            raise ValueError("block must be >= 1 token")
        self.block = block
        self._seen: set[bytes] = set()
        self.prompt_tokens = 0
        self.hit_tokens = 0

    def add(self, tokens: Sequence[object]) -> int:
        """Account one prompt in the order sent; returns the tokens a perfect cache serves."""
        return self.add_blocks(block_hashes(tokens, self.block), len(tokens))

    def add_blocks(self, names: Sequence[bytes], tokens: int) -> int:
        """`add` for a prompt of `tokens` tokens whose block names (`block_hashes`) are known:
        a prompt sent many times is hashed once."""
        hits = 0
        for name in names:
            if name not in self._seen:
                break
            hits += 1
        self._seen.update(names)
        self.prompt_tokens += tokens
        self.hit_tokens += hits * self.block
        return hits * self.block

    @property
    def hit_rate(self) -> float | None:
        """Σ hit tokens / Σ prompt tokens; None before any prompt token."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None


def ideal_hit_rate(prompts: Iterable[Sequence[object]], block: int = DEFAULT_BLOCK) -> float | None:
    """The ideal hit rate of token sequences sent in this order (module docstring)."""
    cache = IdealPrefixCache(block)
    for tokens in prompts:
        cache.add(tokens)
    return cache.hit_rate
