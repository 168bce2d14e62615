"""The target flags (which endpoint, how it is called) and opening the target they name.

Every client flag defaults to None so that a command can tell a flag the user gave from one
left alone: a flag the benchmark does not honour is refused (`options.refuse_unused`), and
`client_options` fills in `ClientOptions`' own defaults for the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from metrale.bounds import COUNT, KIB, TIMEOUT_S
from metrale.cli.parsing import bounded
from metrale.errors import RunError

if TYPE_CHECKING:
    from metrale.endpoint.client import ClientOptions, Target


def add_target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target", "the endpoint under test and how it is called")
    g.add_argument(
        "--target",
        metavar="URL",
        help="OpenAI-compatible base URL (default: start the embedded SmolLM2 model)",
    )
    g.add_argument("--model", help="model name (default: the first one the target serves)")
    g.add_argument("--api-key", metavar="KEY", help="bearer token (default: $OPENAI_API_KEY)")
    g.add_argument(
        "--retries",
        type=bounded(COUNT),
        metavar="N",
        help="retries per call on connection errors, 429 and 5xx (default 2)",
    )
    g.add_argument(
        "--request-timeout",
        type=bounded(TIMEOUT_S),
        metavar="S",
        help="seconds per request, server-side queueing included (default 600)",
    )
    g.add_argument("--no-stream", action="store_true", help="non-streaming calls")  # fmt: skip
    g.add_argument(
        "--max-response-kb",
        type=bounded(KIB),
        metavar="KB",
        help="largest response body kept per call; beyond it the call fails as "
        "response_too_large (default: 16 KiB + 4 KiB per max_tokens token, 0 = no cap)",
    )


def resolve_api_key(flag: str | None) -> str | None:
    return flag if flag is not None else os.environ.get("OPENAI_API_KEY")


def calls_in_flight(bench: object) -> int | None:
    """What a configured benchmark says of its concurrent calls (`plugin.CallsInFlight`); one
    that says nothing gets one slot."""
    from metrale.plugin import CallsInFlight

    return bench.calls_in_flight() if isinstance(bench, CallsInFlight) else 1


@contextlib.asynccontextmanager
async def open_target(
    target: str | None,
    model: str | None,
    api_key: str | None,
    *,
    needs_model: bool = True,
    in_flight: int | None = 1,
) -> AsyncIterator[Target | None]:
    """Yield a probed `Target`: the user's, or the embedded llama-server started for us, with a
    slot for each of the `in_flight` calls the run makes at once (None: unbounded) within what
    memory allows.

    A configuration that calls no model (`Benchmark.needs_model()` False) gets None: no
    server is started and nothing is probed, so such a run needs neither a model nor a network.
    """
    from metrale.endpoint.client import Target
    from metrale.endpoint.probe import probe

    if not needs_model:
        yield None
        return
    api_key = resolve_api_key(api_key)
    if target:
        found = await probe(target, model, api_key)
        yield Target(base_url=found.base_url, model=found.model, api_key=api_key)
        return
    from metrale.endpoint import local

    local.packaged_model_path()  # a missing extra or server is a usage error, before any start
    binary = local.server_binary()
    slots, why = local.slots_for(in_flight, local.available_memory())
    print(f"starting the embedded {binary.name} (SmolLM2-135M-Instruct, {why})...", file=sys.stderr)
    server = local.LocalLlamaServer(parallel=slots, binary=binary)
    async with server as server_url:
        found = await probe(server_url, model, None)
        yield Target(base_url=found.base_url, model=found.model, embedded=True)
    if server.died:
        raise RunError(f"the embedded llama-server died during the run ({server.died})")


def client_options(args: argparse.Namespace) -> ClientOptions:
    """The client options the flags give; a flag left out keeps `ClientOptions`' default."""
    from metrale.endpoint.client import ClientOptions

    given: dict[str, object] = {}
    if args.request_timeout is not None:
        given["request_timeout_s"] = args.request_timeout
    if args.retries is not None:
        given["retries"] = args.retries
    if args.no_stream:
        given["stream"] = False
    if args.max_response_kb is not None:
        given["max_response_bytes"] = args.max_response_kb * 1024
    return ClientOptions.model_validate(given)
