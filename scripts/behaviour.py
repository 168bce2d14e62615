"""Behaviour mutations: the changes a user would notice that cosmic-ray's operators never make.

cosmic-ray swaps operators and constants; statement deletion (`deletion.py`) removes a statement.
Neither makes the mistakes a hand-made review found unnoticed: two durations swapped in the stage
table, retries counted twice, a count of error kinds reported as the count of errors, a start that
no longer cleans up after itself when it fails. This script makes changes of those kinds in each
core module (the modules and test files of `mutation.py`), one at a time in a private copy of
the tree, and reports the ones no test noticed:

- **swap**: two same-typed things exchanged: two adjacent positional arguments of a call (both
  names, attributes or constants of one type), the values of two adjacent keyword arguments or
  dict entries, or a field read in place of a sibling field of the same object in the same
  function (`record.stop_s` for `record.setup_wait_s`: same base, same suffix);
- **cleanup**: a call dropped from an `except` or `finally` body (a `stop()`, a `remove()`, a
  `close()` on an error path);
- **distinct**: a count replaced by a count of distinct values (`len(x)` -> `len(set(x))`,
  `sum(x)` -> `len(set(x))`, `n += 1` -> `n = 1`: once per kind), or a per-rollout sum by the
  last value (`total += x` -> `total = x`).

    python scripts/mutation.py --behaviour summary pool   # via the mutation script
    python scripts/behaviour.py records summary           # or directly; default: all modules
    python scripts/behaviour.py --list-mutants records    # the mutants, not run

Survivors (module, line, kind and the changed line) go to `behaviour-survivors.txt`.
"""

from __future__ import annotations

import argparse
import ast
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutation import (  # the sibling script, found by the line above
    MODULES,
    BaselineFailed,
    Module,
    _annotation_spans,
    _baseline,
    _copy_tree,
    _scope_lines,
    _test_command,
    tests_fail,
)

Span = tuple[int, int, int, int]  # first line, first col, last line, end col (ast positions)


@dataclass(frozen=True)
class Mutant:
    kind: str  # swap, cleanup, distinct
    line: int
    what: str  # a one-line description for the report
    edits: tuple[tuple[Span, str], ...]  # spans of the original source and their new text


def _span(node: ast.AST) -> Span:
    return (node.lineno, node.col_offset, node.end_lineno or node.lineno,  # type: ignore[attr-defined]
            node.end_col_offset or 0)  # type: ignore[attr-defined]  # fmt: skip


def apply(source: str, mutant: Mutant) -> str:
    """`source` with the mutant's edits (spans in ast's 1-based lines, 0-based UTF-8 columns)."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode()))
    data = source.encode()

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + col

    out = data
    for (l1, c1, l2, c2), text in sorted(mutant.edits, key=lambda e: e[0], reverse=True):
        a, b = offset(l1, c1), offset(l2, c2)
        out = out[:a] + text.encode() + out[b:]
    return out.decode()


def _text(source: str, node: ast.AST) -> str:
    return ast.get_source_segment(source, node) or ""


def _kind_of(node: ast.expr) -> str | None:
    """What two arguments must share to be swapped: a constant's type, or 'ref' for names
    and attributes; None for anything else (calls, literals, starred)."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str) and not node.value.isidentifier():
            return None  # a message or a doc, not a name: swapping it is noise
        return type(node.value).__name__
    if isinstance(node, ast.Name | ast.Attribute):
        return "ref"
    return None


def _suffix(name: str) -> str:
    return name.rsplit("_", 1)[-1] if "_" in name else ""


def _swaps(tree: ast.AST, source: str) -> Iterator[Mutant]:
    for node in ast.walk(tree):
        pairs: list[tuple[ast.expr, ast.expr]] = []
        if isinstance(node, ast.Call):
            args = [a for a in node.args if not isinstance(a, ast.Starred)]
            pairs += list(pairwise(args))
            kw = [k.value for k in node.keywords if k.arg is not None]
            pairs += list(pairwise(kw))
        elif isinstance(node, ast.Dict):
            values = [v for k, v in zip(node.keys, node.values, strict=True) if k is not None]
            pairs += list(pairwise(values))
        for a, b in pairs:
            ka, kb = _kind_of(a), _kind_of(b)
            ta, tb = _text(source, a), _text(source, b)
            if ka is None or ka != kb or ta == tb:
                continue
            yield Mutant("swap", a.lineno, f"{ta} <-> {tb}", ((_span(a), tb), (_span(b), ta)))
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        reads: dict[str, set[str]] = {}
        nodes: list[ast.Attribute] = []
        for n in ast.walk(func):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
                reads.setdefault(_text(source, n.value), set()).add(n.attr)
                nodes.append(n)
        for n in nodes:
            base = _text(source, n.value)
            for other in sorted(reads[base] - {n.attr}):
                if _suffix(other) and _suffix(other) == _suffix(n.attr):
                    yield Mutant(
                        "swap",
                        n.lineno,
                        f"{base}.{n.attr} read as {base}.{other}",
                        ((_span(n), f"{base}.{other}"),),
                    )


def _calls_in(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        value = stmt.value if isinstance(stmt, ast.Expr) else None
        if isinstance(value, ast.Await):
            value = value.value
        if isinstance(value, ast.Call):
            yield stmt


def _cleanups(tree: ast.AST, source: str) -> Iterator[Mutant]:
    for node in ast.walk(tree):
        bodies: list[list[ast.stmt]] = []
        if isinstance(node, ast.Try | ast.TryStar):
            bodies += [h.body for h in node.handlers] + [node.finalbody]
        for body in bodies:
            for stmt in _calls_in(body):
                yield Mutant(
                    "cleanup",
                    stmt.lineno,
                    f"dropped: {_text(source, stmt)}",
                    ((_span(stmt), "pass"),),
                )


def _distincts(tree: ast.AST, source: str) -> Iterator[Mutant]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("len", "sum")
            and len(node.args) == 1
            and not node.keywords
        ):
            inner = _text(source, node.args[0])
            if isinstance(node.args[0], ast.GeneratorExp):
                inner = f"({inner})"
            yield Mutant(
                "distinct",
                node.lineno,
                f"{_text(source, node)} -> len(set({inner}))",
                ((_span(node), f"len(set({inner}))"),),
            )
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            target, value = _text(source, node.target), _text(source, node.value)
            if isinstance(node.value, ast.Constant) and node.value.value == 1:
                new, what = f"{target} = 1", f"{target} += 1 -> {target} = 1 (once per kind)"
            elif isinstance(node.value, ast.Constant):
                continue
            else:
                new, what = f"{target} = {value}", f"{target} += {value} -> = (last, not sum)"
            yield Mutant("distinct", node.lineno, what, ((_span(node), new),))


def mutants(source: str, module: Module) -> list[Mutant]:
    """Every behaviour mutant of `source` inside the module's scope, outside annotations and
    `if TYPE_CHECKING:`; each compiles (a mutant that does not is not a behaviour change)."""
    tree = ast.parse(source)
    notes = _annotation_spans(tree)
    scope = _scope_lines(tree, module.scope) if module.scope else None
    found: dict[tuple[tuple[Span, str], ...], Mutant] = {}
    for m in (*_swaps(tree, source), *_cleanups(tree, source), *_distincts(tree, source)):
        first = m.edits[0][0]
        if any(a <= (first[0], first[1]) < b for a, b in notes):
            continue
        if scope is not None and not any(lo <= m.line <= hi for lo, hi in scope):
            continue
        try:
            compile(apply(source, m), module.path, "exec")
        except SyntaxError:
            continue
        found.setdefault(m.edits, m)
    return sorted(found.values(), key=lambda m: (m.line, m.kind, m.what))


@dataclass
class Score:
    name: str
    total: int
    killed: int
    by_kind: dict[str, tuple[int, int]]  # kind -> (killed, total)
    survivors: list[Mutant]

    @property
    def percent(self) -> float:
        return 100.0 * self.killed / self.total if self.total else 100.0


def run_module(
    name: str, work: Path, timeout_s: float | None, nice: int, shard: tuple[int, int] = (0, 1)
) -> Score:
    module = MODULES[name]
    env = {**os.environ, "PYTHONPATH": str(work / "src")}
    per_mutant = _baseline(module, work, env, timeout_s, nice)
    path = work / module.path
    source = path.read_text()
    todo = [m for i, m in enumerate(mutants(source, module)) if i % shard[1] == shard[0]]
    argv = shlex.split(_test_command(module, per_mutant))
    killed, survivors, by_kind = 0, [], {}
    try:
        for m in todo:
            path.write_text(apply(source, m))
            dead = tests_fail(["nice", "-n", str(nice), *argv], work, env, per_mutant + 30)
            k, t = by_kind.get(m.kind, (0, 0))
            by_kind[m.kind] = (k + dead, t + 1)
            killed += dead
            if not dead:
                survivors.append(m)
    finally:
        path.write_text(source)
    return Score(name, len(todo), killed, by_kind, survivors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    parser.add_argument("--list-mutants", action="store_true", help="show the mutants, run none")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant (default: 4x the unmutated test run + 10 s)",
    )
    parser.add_argument("--nice", type=int, default=19, help="niceness of the test runs")
    parser.add_argument(
        "--shard",
        default="0/1",
        metavar="I/N",
        help="run every N-th mutant from the I-th (0-based)",
    )
    parser.add_argument("--survivors", type=Path, default=Path("behaviour-survivors.txt"))
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        print(f"unknown module {unknown[0]!r}; choose from {', '.join(MODULES)}", file=sys.stderr)
        return 2
    index, _, count = args.shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        print(f"--shard {args.shard!r} must be I/N with 0 <= I < N, e.g. 0/2", file=sys.stderr)
        return 2
    if args.timeout is not None and not args.timeout > 0:
        print(f"--timeout {args.timeout:g} must be a number of seconds > 0", file=sys.stderr)
        return 2
    names = args.modules or list(MODULES)
    root = Path(__file__).resolve().parent.parent
    if args.list_mutants:
        for name in names:
            module = MODULES[name]
            for m in mutants((root / module.path).read_text(), module):
                print(f"{name}:{m.line} {m.kind}: {m.what}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scores = []
    with tempfile.TemporaryDirectory(prefix="metrale-behaviour-") as tmp:
        work = Path(tmp).resolve()
        _copy_tree(work)
        for name in names:
            started = time.monotonic()
            try:
                score = run_module(name, work, args.timeout, args.nice, (int(index), int(count)))
            except BaselineFailed as exc:
                print(exc, file=sys.stderr)
                return 1
            print(
                f"{name}: {score.killed}/{score.total} killed ({score.percent:.1f}%) in "
                f"{time.monotonic() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            scores.append(score)
    print("| module | file | mutants | killed | score | swap | cleanup | distinct |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for s in scores:
        kinds = [
            f"{s.by_kind[k][0]}/{s.by_kind[k][1]}" if k in s.by_kind else "-"
            for k in ("swap", "cleanup", "distinct")
        ]
        print(
            f"| {s.name} | {MODULES[s.name].path} | {s.total} | {s.killed} | "
            f"{s.percent:.1f}% | {' | '.join(kinds)} |"
        )
    with args.survivors.open("w") as out:
        for s in scores:
            for m in s.survivors:
                out.write(f"== {s.name} {MODULES[s.name].path}:{m.line} {m.kind}: {m.what}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
