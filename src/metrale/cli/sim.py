"""`metrale sim`: serve the deterministic simulator endpoint."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metrale.bounds import COUNT, DELAY_S, FRACTION, SEED, TOKENS, TOKENS_PER_S, Bound
from metrale.cli.aio import run_async
from metrale.cli.parsing import bounded, no_extra, port
from metrale.errors import UsageError

#: The names of `/metrics` (kept here so that `metrale sim --help` imports no server code).
METRICS_NAMES = ("vllm", "llama-server", "none")
BLOCK = Bound(1, 4096, integer=True, unit="tokens")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sim", help="serve the deterministic simulator endpoint")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8000, help="0 picks a free port")
    p.add_argument("--model", default="metrale-sim")
    delay = bounded(DELAY_S)  # every number flag refuses NaN, infinities and out of range
    p.add_argument("--ttft", type=delay, default=0.0, metavar="S", help="time to first token")
    p.add_argument("--itl", type=delay, default=0.0, metavar="S", help="inter-token delay")
    p.add_argument("--output-tokens", type=bounded(TOKENS), default=16)
    p.add_argument("--reply", default=None, help="fixed reply text (split on spaces)")
    p.add_argument(
        "--error-rate", type=bounded(FRACTION), default=0.0, help="fraction of calls to fail"
    )
    p.add_argument(
        "--error-kinds", default="5xx,drop,malformed", help="comma list of 5xx, drop, malformed"
    )
    p.add_argument("--no-usage", action="store_true", help="send no usage in responses")
    p.add_argument(
        "--header-delay",
        type=bounded(DELAY_S),
        default=0.0,
        metavar="S",
        help="hold the response headers back S after the request (send, headers and first "
        "token then differ)",
    )
    p.add_argument(
        "--require-api-key",
        metavar="KEY",
        help="answer 401 unless a request carries 'Authorization: Bearer KEY'",
    )
    p.add_argument("--seed", type=bounded(SEED), default=0)
    p.add_argument(
        "--max-running",
        type=bounded(COUNT),
        default=0,
        metavar="N",
        help="capacity: at most N requests served at once, the rest queue (0 = no cap)",
    )
    p.add_argument(
        "--token-budget",
        type=bounded(TOKENS_PER_S),
        default=0.0,
        metavar="TOK_S",
        help="capacity: output tokens/s shared by all streams (0 = no budget)",
    )
    p.add_argument(
        "--prefill-s-per-token",
        type=delay,
        default=0.0,
        metavar="S",
        help="serving model: prefill seconds per uncached prompt token, before the first token",
    )
    p.add_argument(
        "--prefix-cache-tokens",
        type=bounded(TOKENS),
        default=0,
        metavar="N",
        help="serving model: an LRU prefix cache (and KV pool) of N tokens; reports "
        "usage.prompt_tokens_details.cached_tokens (0 = no cache)",
    )
    p.add_argument(
        "--cache-block",
        type=bounded(BLOCK),
        default=16,
        metavar="N",
        help="serving model: tokens per prefix-cache block",
    )
    p.add_argument(
        "--tool-turns",
        type=bounded(COUNT),
        default=None,
        metavar="N",
        help="a request with tools gets a call of its first tool, until N tool results follow "
        "the last user message (then text; default: always a call)",
    )
    p.add_argument(
        "--metrics",
        choices=METRICS_NAMES,
        default="vllm",
        help="the /metrics page's names: vllm, llama-server, or none (no page: 404)",
    )
    p.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="serve recorded assistant turns from a JSONL file (see metrale.endpoint.replay)",
    )
    p.set_defaults(handler=handle)  # fmt: skip


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.endpoint.sim import ERROR_KINDS, SimConfig, serve_forever

    no_extra(extra)
    kinds = tuple(k.strip() for k in args.error_kinds.split(",") if k.strip())
    bad = [k for k in kinds if k not in ERROR_KINDS]
    if bad or not kinds:
        raise UsageError(f"unknown --error-kinds {bad}; accepted: {', '.join(ERROR_KINDS)}")
    if not 0 <= args.error_rate <= 1:
        raise UsageError(f"--error-rate {args.error_rate} is outside 0..1")
    if args.ttft < 0 or args.itl < 0 or args.header_delay < 0:
        raise UsageError("--ttft, --itl and --header-delay must be >= 0 seconds")
    if args.token_budget < 0:
        raise UsageError(f"--token-budget {args.token_budget} must be >= 0 tokens/s")
    config = SimConfig(
        host=args.host, port=args.port, model=args.model, ttft_s=args.ttft, itl_s=args.itl,
        output_tokens=args.output_tokens, reply=args.reply, error_rate=args.error_rate,
        error_kinds=kinds, usage=not args.no_usage, seed=args.seed,
        max_running=args.max_running or None, token_budget=args.token_budget or None,
        header_delay_s=args.header_delay, api_key=args.require_api_key,
        prefill_s_per_token=args.prefill_s_per_token,
        prefix_cache_tokens=args.prefix_cache_tokens, cache_block=args.cache_block,
        tool_turns=args.tool_turns, metrics_names=args.metrics,
    )  # fmt: skip
    if args.replay is not None:
        from metrale.endpoint.replay import load_replay

        config.replay = load_replay(args.replay)
    try:
        run_async(lambda: serve_forever(config))
    except asyncio.CancelledError:
        pass
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    return 0
