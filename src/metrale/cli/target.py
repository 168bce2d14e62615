"""The target flags (which endpoint, how it is called) and opening the target they name."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from metrale.cli.parsing import non_negative_int, positive_float
from metrale.errors import RunError


def add_target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target")
    g.add_argument(
        "--target",
        metavar="URL",
        help="OpenAI-compatible base URL (default: start the embedded SmolLM2 model)",
    )
    g.add_argument("--model", help="model name (default: the first one the target serves)")
    g.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    g.add_argument(
        "--retries",
        type=non_negative_int,
        default=2,
        help="retries per call on connection errors, 429 and 5xx (default 2)",
    )
    g.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        metavar="S",
        help="seconds per request, server-side queueing included (default 600)",
    )
    g.add_argument("--no-stream", action="store_true", help="non-streaming calls")  # fmt: skip
    g.add_argument(
        "--max-response-kb",
        type=non_negative_int,
        default=None,
        metavar="KB",
        help="largest response body kept per call; beyond it the call fails as "
        "response_too_large (default: 16 KiB + 4 KiB per max_tokens token, 0 = no cap)",
    )


def resolve_api_key(flag: str | None) -> str | None:
    return flag if flag is not None else os.environ.get("OPENAI_API_KEY")


@contextlib.asynccontextmanager
async def open_target(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Yield a probed `Target`: the user's, or the embedded llama.cpp server started for us."""
    from metrale.endpoint.client import Target
    from metrale.endpoint.probe import probe

    api_key = resolve_api_key(args.api_key)
    if args.target:
        found = await probe(args.target, args.model, api_key)
        yield Target(base_url=found.base_url, model=found.model, api_key=api_key)
        return
    from metrale.endpoint.local import LocalLlamaServer, embedded_model_path

    embedded_model_path()  # a missing extra is a usage error, before anything starts
    print("starting the embedded llama.cpp server (SmolLM2-135M-Instruct)...", file=sys.stderr)
    server = LocalLlamaServer()
    async with server as server_url:
        found = await probe(server_url, args.model, None)
        yield Target(base_url=found.base_url, model=found.model, embedded=True)
    if server.died:
        raise RunError(f"the embedded llama.cpp server died during the run ({server.died})")


def client_options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from metrale.endpoint.client import ClientOptions

    return ClientOptions(
        request_timeout_s=args.request_timeout,
        retries=args.retries,
        stream=not args.no_stream,
        max_response_bytes=None if args.max_response_kb is None else args.max_response_kb * 1024,
    )
