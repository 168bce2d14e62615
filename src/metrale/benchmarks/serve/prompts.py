"""Prompts for the serve benchmark: synthetic of a requested length, bundled GSM8K, or a JSONL file.

Synthetic prompts are seeded random words. Their length is **exact** when the server has a
tokenize endpoint (`/tokenize` on vLLM, SGLang and llama.cpp's server; `/extras/tokenize` on
llama-cpp-python's): the user message then holds exactly `input_tokens` tokens by the server's
own tokenizer, not counting the chat template (the template's few tokens show in the usage's
`prompt_tokens`). Otherwise the length is **approximate** (one word taken for 1.3 tokens) and the
result says so (`input_tokens_exact = 0`).

GSM8K questions come from the package's shared data sets (`metrale.datasets`).
A JSONL file has one object a line with `prompt` (a string) or `messages` (a chat list), and
optionally `max_tokens`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from metrale.endpoint.client import Target
from metrale.endpoint.http import ConnectionPool, HttpConnectionError, HttpProtocolError
from metrale.errors import UsageError, read_user_file

WORDS_PER_TOKEN = 1 / 1.3
#: A tokenize answer is a count or a token list: a prompt of 1M tokens is ~8 MB of JSON.
MAX_TOKENIZE_BYTES = 16 * 1024 * 1024
_VOCAB = [
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
]


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, Any]]
    max_tokens: int | None = None


def _is_message(m: object) -> bool:
    """A chat message: a role, and content that is text or parts, or null on an assistant
    message (one that only calls tools, as OpenAI's API sends it)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        return False
    content = m.get("content", "")
    return isinstance(content, str | list) or (content is None and m["role"] == "assistant")


def load_jsonl(path: Path) -> list[Prompt]:
    """Prompts from a JSONL file; a `UsageError` naming the first bad line otherwise."""
    text = read_user_file(path, "prompts file")
    prompts: list[Prompt] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise UsageError(f"prompts file {path} line {n} is not JSON") from None
        if not isinstance(row, dict):
            raise UsageError(f"prompts file {path} line {n}: expected an object")
        max_tokens = row.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise UsageError(f"prompts file {path} line {n}: max_tokens must be a positive int")
        if isinstance(row.get("prompt"), str):
            messages = [{"role": "user", "content": row["prompt"]}]
        elif isinstance(row.get("messages"), list) and row["messages"]:
            messages = row["messages"]
            if not all(_is_message(m) for m in messages):
                raise UsageError(
                    f"prompts file {path} line {n}: each of 'messages' must be an object "
                    "with a 'role' string and 'content' (a string or a list of parts; null "
                    "on an assistant message)"
                )
        else:
            raise UsageError(
                f"prompts file {path} line {n}: needs 'prompt' (a string) or 'messages' (a list)"
            )
        prompts.append(Prompt(messages, max_tokens))
    if not prompts:
        raise UsageError(f"prompts file {path} has no prompts")
    return prompts


def gsm8k_questions() -> list[Prompt]:
    """The GSM8K test questions (`metrale.datasets.gsm8k_test`)."""
    from metrale.datasets import gsm8k_test

    return [Prompt([{"role": "user", "content": row.question}]) for row in gsm8k_test()]


class Tokenizer:
    """Counts tokens with the server's tokenize endpoint; `count` is None when there is none.

    Its calls go through the endpoint layer's pool (the serve client's), as every call to the
    target does; they are not measured.
    """

    def __init__(self, pool: ConnectionPool, target: Target, timeout_s: float = 30.0) -> None:
        self.pool = pool
        root = pool.path_prefix.removesuffix("/v1")
        self.model = target.model
        self.timeout_s = timeout_s
        self._candidates = [
            (root + "/tokenize", "prompt"),  # vLLM, SGLang (and metrale sim)
            (root + "/tokenize", "content"),  # llama.cpp server
            (root + "/extras/tokenize", "input"),  # llama-cpp-python
        ]
        self._found: tuple[str, str] | None = None
        self._offset = 0
        self.available = False

    async def detect(self) -> bool:
        """Find a working endpoint; its count of "" (BOS and the like) is subtracted later.

        A candidate counts only when it finds tokens in a non-empty text: llama-server answers
        a body in the wrong field (`prompt` for its `content`) with 200 and no tokens."""
        for path, field in self._candidates:
            with contextlib.suppress(HttpConnectionError, HttpProtocolError, TimeoutError):
                probe = await self._raw(path, field, "hello world")
                n = await self._raw(path, field, "") if probe else None
                if probe is not None and n is not None and probe > n:
                    self._found, self._offset, self.available = (path, field), n, True
                    return True
        return False

    async def _raw(self, path: str, field: str, text: str) -> int | None:
        body: dict[str, Any] = {field: text}
        if field == "prompt":
            body["model"] = self.model
            body["add_special_tokens"] = False
        async with asyncio.timeout(self.timeout_s):
            resp = await self.pool.post(path, orjson.dumps(body), under_base=False)
            try:
                raw = await resp.read(MAX_TOKENIZE_BYTES)
            finally:
                resp.release()
        if resp.status != 200:
            return None
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(data, dict):
            return None
        count = data.get("count")
        if isinstance(count, int):
            return count
        tokens = data.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    async def count(self, text: str) -> int:
        assert self._found is not None
        n = await self._raw(*self._found, text)
        if n is None:
            raise RuntimeError("the tokenize endpoint stopped answering")
        return max(0, n - self._offset)


async def synthetic(
    n_prompts: int,
    input_tokens: int,
    seed: int,
    tokenizer: Tokenizer | None,
    shared_prefix_tokens: int = 0,
) -> tuple[list[Prompt], bool]:
    """`n_prompts` distinct prompts of `input_tokens` tokens each; True when lengths are exact.

    With `shared_prefix_tokens`, each prompt opens with the same system message of that many
    tokens (seeded apart from the user messages), then its own user message: a workload whose
    prefix a server's cache can serve, `shared / (shared + input)` of every prompt after the first.

    Exact: words are added until the text reaches the length, the last word dropped while it
    overshoots, then single short words (" a", else " 1") pad it; at most ~input_tokens + 20
    tokenize calls a prompt, usually a handful, since the first guess is close.
    """
    rng = random.Random(seed)
    prompts: list[Prompt] = []
    exact = tokenizer is not None and tokenizer.available
    head: list[dict[str, Any]] = []
    if shared_prefix_tokens:
        shared = random.Random(f"shared-prefix-{seed}")
        words = ["shared:"] + [shared.choice(_VOCAB) for _ in range(shared_prefix_tokens * 2 + 8)]
        text = await text_of(words, shared_prefix_tokens, tokenizer if exact else None)
        head = [{"role": "system", "content": text}]
    for i in range(n_prompts):
        words = [f"{i}:"] + [rng.choice(_VOCAB) for _ in range(input_tokens * 2 + 8)]
        text = await text_of(words, input_tokens, tokenizer if exact else None)
        prompts.append(Prompt([*head, {"role": "user", "content": text}]))
    return prompts, exact


async def text_of(words: list[str], tokens: int, tokenizer: Tokenizer | None) -> str:
    """`words` cut to `tokens` tokens: exactly with a tokenizer, else at 1.3 tokens a word."""
    guess = max(1, round(tokens * WORDS_PER_TOKEN))
    if tokenizer is None:
        return " ".join(words[:guess])
    return await _exact_text(words, guess, tokens, tokenizer)


async def _exact_text(words: list[str], guess: int, target: int, tok: Tokenizer) -> str:
    """Scale the word count by target/count (a few steps), step by one word, then pad."""
    k = min(guess, len(words))
    n = await tok.count(" ".join(words[:k]))
    for _ in range(6):
        if n == target or n == 0:
            break
        step = round(k * target / n) - k
        if step == 0:
            break
        k = min(max(1, k + step), len(words))
        n = await tok.count(" ".join(words[:k]))
    for _ in range(64):
        if n < target and k < len(words):
            m = await tok.count(" ".join(words[: k + 1]))
            if m > target:
                break
            k, n = k + 1, m
        elif n > target and k > 1:
            k -= 1
            n = await tok.count(" ".join(words[:k]))
        else:
            break
    text = " ".join(words[:k])
    for pad in (" a", " 1", " x"):
        for _ in range(target - n + 2):
            if n >= target:
                break
            m = await tok.count(text + pad)
            if m > target:
                break
            text, n = text + pad, m
        if n == target:
            return text
    raise RuntimeError(f"could not build a prompt of exactly {target} tokens (got {n})")
