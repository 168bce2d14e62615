"""`metrale sandbox-sim SERVICE`: serve a local emulator of a remote sandbox service, with real
sandboxes behind it, and print the environment its official SDK needs to reach it.

`SERVICES` is the table of emulators: a service's name and where its emulator class lives
(`module:Class`, built as `Class(backend, faults)`), imported only when picked.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Sequence
from typing import Any

from metrale.bounds import COUNT, FRACTION, RATE_PER_S, SEED
from metrale.cli.aio import run_async
from metrale.cli.parsing import bounded, no_extra, port
from metrale.errors import UsageError

SERVICES: dict[str, str] = {
    "prime": "metrale.sandbox_sim.prime:PrimeEmulator",
    "modal": "metrale.sandbox_sim.modal:ModalEmulator",
}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sandbox-sim",
        help="serve a local emulator of a remote sandbox service (real sandboxes behind it)",
    )
    p.add_argument("service", metavar="SERVICE", help=f"one of: {', '.join(SERVICES)}")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=0, help="0 (default) picks a free port")
    p.add_argument(
        "--backend", default="bwrap",
        help="bwrap (default: no engine needed), docker (the container engine, for task "
        "images), or auto (docker when an engine answers, else bwrap)",
    )  # fmt: skip
    p.add_argument(
        "--image", action="append", default=[], metavar="NAME=LOCAL",
        help="map a registry image name to a local image (docker) or to a directory holding "
        "an exported root file system (bwrap); repeatable",
    )  # fmt: skip
    p.add_argument(
        "--create-latency", default=None, metavar="P50,P90",
        help="seconds a creation stays pending, drawn from a lognormal with this median and "
        "90th percentile (e.g. 10.9,14)",
    )  # fmt: skip
    p.add_argument(
        "--create-rate", type=bounded(RATE_PER_S), default=None, metavar="N",
        help="creations accepted per second; over it: 429 / RESOURCE_EXHAUSTED",
    )  # fmt: skip
    p.add_argument(
        "--quota", type=bounded(COUNT), default=None, metavar="N",
        help="live sandboxes at most; a creation over it is refused like one over the rate",
    )  # fmt: skip
    p.add_argument(
        "--stuck", type=bounded(FRACTION), default=0.0, metavar="F",
        help="fraction of creations left pending forever",
    )  # fmt: skip
    p.add_argument(
        "--gateway-fail", type=bounded(FRACTION), default=0.0, metavar="F",
        help="fraction of commands whose gateway fails mid-command",
    )  # fmt: skip
    p.add_argument("--seed", type=bounded(SEED), default=0, help="seed of every injected draw")
    p.set_defaults(handler=handle)


def emulator_class(service: str) -> Any:
    where = SERVICES.get(service)
    if where is None:
        raise UsageError(f"unknown sandbox service {service!r}; accepted: {', '.join(SERVICES)}")
    module, _, name = where.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise UsageError(
            f"the {service} emulator needs its SDK ({exc.name}): pip install 'metrale[{service}]'"
        ) from None


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.sandbox_sim.backend import Backend, parse_image_map
    from metrale.sandbox_sim.faults import FaultConfig, Faults, parse_latency
    from metrale.sandbox_sim.server import serve_forever

    no_extra(extra)
    cls = emulator_class(args.service)
    faults = FaultConfig(
        create_latency=parse_latency(args.create_latency) if args.create_latency else None,
        create_rate=args.create_rate, quota=args.quota, stuck=args.stuck,
        gateway_fail=args.gateway_fail, seed=args.seed,
    )  # fmt: skip
    backend = Backend(args.backend, parse_image_map(args.image))
    backend.check()
    emulator = cls(backend, Faults(faults))
    try:
        run_async(lambda: serve_forever(emulator, args.service, args.host, args.port))
    except asyncio.CancelledError:
        pass
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    return 0
