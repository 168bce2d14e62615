"""Benchmark parameters given on the command line."""

from __future__ import annotations

from collections.abc import Sequence

from metrale.errors import UsageError


def parse_bench_args(extra: Sequence[str], pairs: Sequence[str]) -> dict[str, str]:
    """`--rollouts 8`, `--max-concurrent=4`, `--no-flag` and `-p key=value` into a raw dict."""
    raw: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"-p expects KEY=VALUE, got {pair!r}")
        raw[key.strip().replace("-", "_")] = value
    tokens = list(extra)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or len(tok) == 2:
            raise UsageError(f"unexpected argument {tok!r}; benchmark parameters are --name VALUE")
        name, sep, value = tok[2:].partition("=")
        name = name.replace("-", "_")
        if not sep:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt is None or nxt.startswith("--"):
                if name.startswith("no_"):
                    name, value = name[3:], "false"
                else:
                    value = "true"
            else:
                value = nxt
                i += 1
        # A repeated flag accumulates, comma-joined: --slo ttft_ms=200 --slo tpot_ms=50.
        raw[name] = f"{raw[name]},{value}" if name in raw else value
        i += 1
    return raw
