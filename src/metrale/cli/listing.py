"""`metrale list`: the installed benchmarks and their parameters."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from metrale.cli.parsing import no_extra

if TYPE_CHECKING:
    from metrale.plugin import Benchmark


#: a default longer than this is cut in the table (in full in `--json` and `run BENCH --help`)
_DEFAULT_WIDTH = 24


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "list",
        help="list benchmarks with their parameters, and the runtimes",
        description="Every installed benchmark with its parameters (flags of 'metrale run "
        "BENCH' and 'metrale matrix BENCH'): type and bounds, default, and whether a sweep "
        "may vary it ('axis'); then every installed runtime with what it provides.",
    )
    p.add_argument(
        "--json", action="store_true", help="as JSON, with sweep axes and honoured flags"
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from metrale.fmt import safe_text
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
                "sweep_axes": bench.sweep_axes(),
                "options": sorted(cls.options),
            })  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    print(safe_text(render_list(found)))
    print(safe_text(render_runtimes()))
    return 0


def render_list(found: dict[str, type[Benchmark]]) -> str:
    """One block per benchmark, its parameters in columns aligned across every block."""
    rows: dict[str, list[tuple[str, str, str, str]]] = {}
    for bench_id, cls in found.items():
        bench = cls()
        axes = set(bench.sweep_axes())
        rows[bench_id] = [
            (
                "--" + spec.name.replace("_", "-"),
                spec.describe_type(),
                _default_text(spec.default),
                spec.help + ("  (axis)" if spec.name in axes else ""),
            )
            for spec in bench.parameters()
        ]
    every = [r for block in rows.values() for r in block] or [("", "", "", "")]
    widths = [max(len(r[i]) for r in every) for i in range(3)]
    lines: list[str] = []
    for bench_id, cls in found.items():
        d = cls.descriptor
        lines.append(f"{bench_id}: {d.name}. {d.summary}")
        for flag, kind, default, help_text in rows[bench_id]:
            lines.append(
                f"  {flag:<{widths[0]}}  {kind:<{widths[1]}}  {default:<{widths[2]}}  {help_text}"
            )
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def render_runtimes() -> str:
    """One line per installed runtime: its name, its capabilities, its docstring's first
    sentence. A plugin that cannot be loaded is listed with why."""
    from metrale.errors import UsageError
    from metrale.runtime.registry import config_class, runtime_names

    rows: list[tuple[str, str, str]] = []
    for name in runtime_names():
        try:
            cls = config_class(name)
        except UsageError as exc:
            rows.append((name, "-", str(exc)))
            continue
        doc = " ".join((cls.__doc__ or "").split()).split(". ")[0].rstrip(".")
        caps = ", ".join(sorted(cls.capabilities)) or "-"
        if "inner" in cls.model_fields:  # a runtime holding another: what that one provides
            caps = "its inner runtime's"
        rows.append((name, caps, doc if len(doc) <= 90 else doc[:87] + "..."))
    width = [max((len(r[i]) for r in rows), default=0) for i in range(2)]
    lines = ["runtimes (--runtime NAME), with the capabilities benchmarks ask for:"]
    lines += [f"  {n:<{width[0]}}  {c:<{width[1]}}  {d}" for n, c, d in rows]
    return "\n".join(lines) + "\n"


def _default_text(default: object) -> str:
    text = "none" if default is None else repr(default)
    if len(text) > _DEFAULT_WIDTH:
        text = text[: _DEFAULT_WIDTH - 3] + "..."
    return text
