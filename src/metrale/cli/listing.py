"""`metrale list`: the installed benchmarks and their parameters."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from metrale.cli.parsing import no_extra


def add_parser(sub: Any) -> None:
    p = sub.add_parser("list", help="list benchmarks with their parameters")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.plugin import discover

    no_extra(extra)
    found = discover()
    if args.json:
        out: list[dict[str, Any]] = []
        for cls in found.values():
            bench = cls()
            out.append({
                **cls.descriptor.model_dump(),
                "parameters": [s.model_dump() for s in bench.parameters()],
            })  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    for bench_id, cls in found.items():
        d = cls.descriptor
        print(f"{bench_id}: {d.name}. {d.summary}")
        for spec in cls().parameters():
            default = "none" if spec.default is None else repr(spec.default)
            print(f"  --{spec.name.replace('_', '-'):<18} {spec.describe_type():<28} "
                  f"default {default}  {spec.help}")  # fmt: skip
        print()
    return 0
