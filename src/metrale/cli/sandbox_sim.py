"""`metrale sandbox-sim SERVICE --port P`: a local emulator of a remote sandbox service that
its official SDK, unmodified, talks to; real sandboxes (bwrap) behind it. A subprocess
backend is not offered: a sandbox's absolute paths would be the host's."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

from metrale.bounds import COUNT, DELAY_S, FRACTION, RATE_PER_S, SEED
from metrale.cli.aio import run_async
from metrale.cli.parsing import bounded, no_extra, port
from metrale.errors import UsageError

#: The services emulated: name -> what a user sets to point the SDK at it.
SERVICES = {"modal": "MODAL_SERVER_URL=http://HOST:PORT"}
BACKENDS = ("bwrap",)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sandbox-sim",
        help="serve a local emulator of a remote sandbox service (modal)",
        description="A local stand-in for a sandbox service: its official SDK talks to it over "
        "the wire, real sandboxes run behind it, and it can replay the service's faults. "
        + "; ".join(f"{name}: {how}" for name, how in SERVICES.items()),
    )
    p.add_argument("service", choices=sorted(SERVICES), help="the service to emulate")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=0, help="0 picks a free port")
    p.add_argument(
        "--state-port", type=port, default=None, help="serve GET /_state (live sandboxes) here"
    )
    p.add_argument(
        "--backend", choices=BACKENDS, default="bwrap", help="the real sandbox behind each one"
    )
    p.add_argument(
        "--create-latency",
        metavar="P50,P90",
        help="seconds from creation to running, log-normal with this median and 90th percentile",
    )
    p.add_argument(
        "--create-rate",
        type=bounded(RATE_PER_S),
        metavar="PER_S",
        help="creations per second; beyond: RESOURCE_EXHAUSTED",
    )
    p.add_argument(
        "--quota",
        type=bounded(COUNT),
        metavar="N",
        help="live sandboxes at once; beyond: RESOURCE_EXHAUSTED",
    )
    p.add_argument(
        "--stuck",
        type=bounded(FRACTION),
        default=0.0,
        metavar="FRACTION",
        help="fraction of creations that stay pending until terminated",
    )
    p.add_argument("--seed", type=bounded(SEED), default=0)
    p.set_defaults(handler=handle)


def parse_latency(text: str | None) -> tuple[float, float] | None:
    """`P50,P90` seconds, P90 >= P50 > 0."""
    if text is None:
        return None
    parts = text.split(",")
    parse = bounded(DELAY_S)
    try:
        p50, p90 = (float(parse(part)) for part in parts) if len(parts) == 2 else (0.0, -1.0)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--create-latency {text!r}: {exc}") from None
    if not 0 < p50 <= p90:
        raise UsageError(
            f"--create-latency {text!r}: accepted: P50,P90 seconds with 0 < P50 <= P90, e.g. 8,12.5"
        )
    return p50, p90


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    no_extra(extra)
    latency = parse_latency(args.create_latency)
    try:
        from metrale.sandbox_sim.modal import ModalEmulator, ModalFaults, serve
    except ImportError:
        raise UsageError(
            "sandbox-sim modal needs the modal extra: pip install 'metrale[modal]'"
        ) from None
    from metrale.runtime import create_runtime, runtime_config

    backend = args.backend
    runtime_config(backend).check()

    def make_runtime(workdir: str) -> Any:
        return create_runtime(
            runtime_config(backend, workdir=workdir if workdir != "/" else "/work")
        )

    faults = ModalFaults(
        create_latency=latency,
        create_rate=args.create_rate,
        quota=args.quota,
        stuck=args.stuck,
        seed=args.seed,
    )
    emulator = ModalEmulator(make_runtime, faults=faults)

    def ready(bound: int, state: int | None) -> None:
        where = f"http://{args.host}:{bound}"
        line = f"modal emulator at {where} (MODAL_SERVER_URL={where})"
        if state is not None:
            line += f"; state at http://{args.host}:{state}/_state"
        print(line, flush=True)

    try:
        run_async(lambda: serve(emulator, args.host, args.port, state_port=args.state_port,
                                ready=ready))  # fmt: skip
    except asyncio.CancelledError:
        pass
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    return 0
