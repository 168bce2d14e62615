"""Statement deletion: does a test fail when one line of a core module is not run?

cosmic-ray changes operators and constants; the bugs a reviewer fears most are often a missing
statement instead: no `flush()` after a record, no `stop()` in a `finally`, no signal handler,
a `raise` that never happens, a counter never incremented. This script deletes each statement of
a core module in turn (replaces it by `pass`), runs that module's fast tests (the same modules
and test files as `scripts/mutation.py`) and reports the deletions no test noticed.

A compound statement (`if`, `for`, `with`, `try`) is deleted whole, and each statement inside it
is deleted on its own too. Not deleted: docstrings, `pass`, imports, `def` and `class` (their
removal is a NameError at once), field declarations without a value, `global`/`nonlocal`,
what sits under `if TYPE_CHECKING:`, `__slots__`, `Literal`/`Union` type aliases and
`TypeVar`s (none changes what runs).

    python scripts/deletion.py answer stats      # some modules; default: all of them
    python scripts/deletion.py --nice 0 records  # full priority (default: nice 19)
    python scripts/deletion.py --shard 0/2 pool  # every second deletion

Each mutant runs in a private copy of the tree (an interrupt never leaves a mutant in the
sources); survivors (module, line, the statement) go to `deletion-survivors.txt`.
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
from dataclasses import dataclass, field
from pathlib import Path

from mutation import (
    MODULES,
    BaselineFailed,
    Module,
    _baseline,
    _copy_tree,
    _scope_lines,
    _test_command,
    tests_fail,
)

_KEPT_OUT = (
    ast.Pass,
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Global,
    ast.Nonlocal,
)


@dataclass(frozen=True)
class Deletion:
    first: int  # 1-based line numbers, inclusive
    last: int
    indent: str
    text: str  # the statement's first line, for the report


def _is_docstring(node: ast.stmt, body: list[ast.stmt]) -> bool:
    return (
        node is body[0]
        and isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _bodies(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        body = getattr(node, name, None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            yield body
    for handler in getattr(node, "handlers", []):
        yield handler.body
    for case in getattr(node, "cases", []):
        yield case.body


def _in_scope(node: ast.stmt, scope: list[tuple[int, int]] | None) -> bool:
    return scope is None or any(lo <= node.lineno <= hi for lo, hi in scope)


def deletions(source: str, module: Module) -> list[Deletion]:
    """Every statement worth deleting, outermost first, in source order."""
    tree = ast.parse(source)
    lines = source.splitlines()
    scope = _scope_lines(tree, module.scope) if module.scope else None
    found: list[Deletion] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                continue
            keep_out = isinstance(node, _KEPT_OUT) or _is_docstring(node, body)
            keep_out |= isinstance(node, ast.AnnAssign) and node.value is None
            keep_out |= _only_for_types(node)
            if not keep_out and _in_scope(node, scope) and _whole_lines(node, lines):
                first, last = node.lineno, node.end_lineno or node.lineno
                text = lines[first - 1].strip()
                found.append(Deletion(first, last, lines[first - 1][: node.col_offset], text))
            for inner in _bodies(node):
                visit(inner)

    visit(tree.body)
    return found


def _only_for_types(node: ast.stmt) -> bool:
    """`__slots__` (memory, not behaviour), a type alias (`Verdict = Literal[...]`) or a
    `TypeVar`: read only by annotations, which the modules never evaluate."""
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        return False
    target, value = node.targets[0], node.value
    if isinstance(target, ast.Name) and target.id == "__slots__":
        return True
    if isinstance(value, ast.Call):  # T = TypeVar("T")
        return isinstance(value.func, ast.Name) and value.func.id == "TypeVar"
    base = value.value if isinstance(value, ast.Subscript) else None
    return isinstance(base, ast.Name) and base.id in ("Literal", "Union", "Optional")


def _whole_lines(node: ast.stmt, lines: list[str]) -> bool:
    """The statement owns its lines (no `a; b` sharing a line with it)."""
    end_line, end_col = node.end_lineno or node.lineno, node.end_col_offset or 0
    before = lines[node.lineno - 1][: node.col_offset]
    after = lines[end_line - 1][end_col:].strip()
    return not before.strip() and (not after or after.startswith("#"))


def mutate(source: str, d: Deletion) -> str:
    lines = source.splitlines(keepends=True)
    return "".join([*lines[: d.first - 1], f"{d.indent}pass\n", *lines[d.last :]])


@dataclass
class Score:
    name: str
    total: int = 0
    killed: int = 0
    survivors: list[Deletion] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return 100.0 * self.killed / self.total if self.total else 100.0


def run_module(
    name: str, work: Path, nice: int, timeout_s: float | None, shard: tuple[int, int] = (0, 1)
) -> Score:
    module = MODULES[name]
    env = {**os.environ, "PYTHONPATH": str(work / "src")}
    timeout_s = _baseline(module, work, env, timeout_s, nice=nice)
    argv = ["nice", "-n", str(nice), *shlex.split(_test_command(module, timeout_s))]
    path = work / module.path
    original = path.read_text()
    score = Score(name)
    try:
        for d in deletions(original, module)[shard[0] :: shard[1]]:
            path.write_text(mutate(original, d))
            score.total += 1
            if tests_fail(argv, work, env, timeout_s + 30):
                score.killed += 1
            else:
                score.survivors.append(d)
    finally:
        path.write_text(original)
    return score


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    parser.add_argument("--nice", type=int, default=19, help="niceness of the test runs")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant (default: 4x the unmutated run + 10 s)",
    )
    parser.add_argument(
        "--shard", default="0/1", metavar="I/N", help="every N-th deletion from the I-th (0-based)"
    )
    parser.add_argument("--survivors", type=Path, default=Path("deletion-survivors.txt"))
    args = parser.parse_args(argv)
    index, _, count = args.shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        print(f"--shard {args.shard!r} must be I/N with 0 <= I < N, e.g. 0/2", file=sys.stderr)
        return 2
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        print(f"unknown module {unknown[0]!r}; choose from {', '.join(MODULES)}", file=sys.stderr)
        return 2
    if not -20 <= args.nice <= 19:
        print(f"--nice {args.nice} must be between -20 and 19", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scores = []
    with (
        tempfile.TemporaryDirectory(prefix="metrale-deletion-") as tmp,
        args.survivors.open("w") as out,
    ):
        work = Path(tmp).resolve()
        _copy_tree(work)
        for name in args.modules or list(MODULES):
            started = time.monotonic()
            try:
                score = run_module(name, work, args.nice, args.timeout, (int(index), int(count)))
            except BaselineFailed as exc:
                print(exc, file=sys.stderr)
                return 1
            print(
                f"{name}: {score.killed}/{score.total} deletions killed ({score.percent:.1f}%) "
                f"in {time.monotonic() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            for d in score.survivors:  # as each module ends: a long run can be read meanwhile
                out.write(f"{name} {MODULES[name].path}:{d.first} {d.text}\n")
            out.flush()
            scores.append(score)
    print("| module | file | deletions | killed | score |")
    print("| --- | --- | --- | --- | --- |")
    for s in scores:
        print(f"| {s.name} | {MODULES[s.name].path} | {s.total} | {s.killed} | {s.percent:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
