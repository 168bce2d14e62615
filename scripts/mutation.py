"""Mutation testing of the core modules with cosmic-ray: how many small bugs do the tests catch?

Each module is mutated in a private copy of the work tree (never in place: an interrupted run
must not leave a mutant behind in the sources), and each mutant runs only that module's fast
test files, under `nice -n 19`, so that a shared 2-core machine stays usable. `PYTHONPATH`
points at the copy, so the tests that start `python -m metrale` in a child process run the
mutant too.

The mutant set is cosmic-ray's core operators, trimmed to the mutations a reviewer would try by
hand: a comparison moved to its boundary neighbour or negated (`<` <-> `<=`, `==` <-> `!=`,
`is` <-> `is not`, `in` <-> `not in`), arithmetic swapped with its inverse (`+` <-> `-`,
`*` <-> `/`, ...), numbers off by one, `not` added or removed, `and` <-> `or`, `True` <->
`False`, `break` <-> `continue`, a loop that runs zero times, an `except` that catches nothing,
a decorator removed. Cosmic-ray's other binary swaps (`-` -> `<<`, `*` -> `^`, ...) crash at
once and only inflate the score; mutants inside type annotations change nothing (the modules
use `from __future__ import annotations`), nor does negating `if TYPE_CHECKING:` (a name for
the type checker is imported at run time too), so all three are dropped before the run.

    python scripts/mutation.py                 # every module, score table on stdout
    python scripts/mutation.py stats rollout   # some modules
    python scripts/mutation.py --list          # modules and their test files
    python scripts/mutation.py --behaviour pool  # behaviour mutants instead (scripts/behaviour.py)

Beside cosmic-ray's operators, `--behaviour` makes the changes a user would notice and no
operator makes (two same-typed fields or arguments swapped, a cleanup call dropped from an error
path, a count replaced by a count of distinct values): see `scripts/behaviour.py`.

Survivors (module, line, operator and the diff) go to `mutation-survivors.txt` in the current
directory. Needs the `mutation` extra (`pip install -e '.[dev,mutation]'`).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Module:
    path: str
    tests: tuple[str, ...]
    #: When set, only mutants inside these top-level functions (or classes) count.
    scope: tuple[str, ...] = ()


MODULES: dict[str, Module] = {
    "answer": Module(
        "src/metrale/benchmarks/gsm8k/answer.py", ("tests/benchmarks/test_gsm8k_answer.py",)
    ),
    "stats": Module("src/metrale/stats.py", ("tests/test_stats.py",)),
    # The endpoint client: retries, errors and the call record in client.py; the one SSE
    # parser, the TTFT / E2E / ITL clocks and the token source in stream.py.
    "client": Module(
        "src/metrale/endpoint/client.py",
        ("tests/endpoint/test_client.py", "tests/endpoint/test_client_timing.py"),
    ),
    "stream": Module(
        "src/metrale/endpoint/stream.py",
        (
            "tests/endpoint/test_stream.py",
            "tests/endpoint/test_client_timing.py",
            "tests/endpoint/test_client.py",
        ),
    ),
    # The rollout driver: the pool (stage clocks, stop on every path, one record per rollout),
    # the benchmark base it drives, the records and the summary built from them.
    "pool": Module(
        "src/metrale/rollout/pool.py",
        (
            "tests/test_rollout.py",
            "tests/test_start_limiter.py",
            "tests/test_driver.py",
            "tests/test_warm_pool.py",
            "tests/test_reservoir.py",
            "tests/test_what_users_see.py",
        ),
    ),
    # the warm pool (--runtime-pool) and the bounded samples the summary is built from
    "warm": Module("src/metrale/rollout/warm.py", ("tests/test_warm_pool.py",)),
    "reservoir": Module(
        "src/metrale/rollout/reservoir.py", ("tests/test_reservoir.py", "tests/test_rollout.py")
    ),
    "driver": Module(
        "src/metrale/rollout/driver.py",
        ("tests/test_driver.py", "tests/test_rollout.py", "tests/test_what_users_see.py"),
    ),
    "records": Module(
        "src/metrale/rollout/records.py",
        ("tests/test_rollout.py", "tests/test_driver.py", "tests/test_what_users_see.py"),
    ),
    "summary": Module(
        "src/metrale/rollout/summary.py",
        (
            "tests/test_rollout.py",
            "tests/test_driver.py",
            "tests/test_start_limiter.py",
            "tests/test_reservoir.py",
            "tests/benchmarks/agentic_webserver/test_metrics.py",
            "tests/test_what_users_see.py",
        ),
    ),
    "limiter": Module("src/metrale/rollout/limiter.py", ("tests/test_start_limiter.py",)),
    "compare": Module(
        "src/metrale/matrix/compare.py",
        ("tests/matrix/test_compare.py", "tests/test_what_users_see.py"),
    ),
    # Budgets: reading BENCH.toml (budgets.py) and the check that makes them a verdict
    # (plugin/results.py; only the bound-checking part of it is core).
    "budgets": Module("src/metrale/budgets.py", ("tests/test_budgets.py", "tests/test_plugin.py")),
    # The bwrap runtime's start and stop: what a failed, cancelled or finished sandbox leaves.
    "bwrap": Module(
        "src/metrale/runtime/bwrap_runtime.py",
        ("tests/runtime/test_start_cleanup.py", "tests/runtime/test_bwrap_stop.py"),
    ),
    "verdict": Module(
        "src/metrale/plugin/results.py",
        ("tests/test_budgets.py", "tests/test_plugin.py"),
        scope=("check_bounds", "Verdict", "Check", "_value_text", "_num_text"),
    ),
}

#: Binary operator swaps kept (cosmic-ray names): each operator to its inverse or neighbour.
_BINARY_KEPT = {
    ("Add", "Sub"), ("Sub", "Add"), ("Mul", "Div"), ("Div", "Mul"), ("FloorDiv", "Div"),
    ("Mod", "FloorDiv"), ("Pow", "Mul"), ("BitOr", "BitAnd"), ("BitAnd", "BitOr"),
}  # fmt: skip
#: Comparison swaps kept: the boundary neighbour and the negation.
_COMPARE_KEPT = {
    ("Lt", "LtE"), ("LtE", "Lt"), ("Gt", "GtE"), ("GtE", "Gt"), ("Lt", "GtE"), ("LtE", "Gt"),
    ("Gt", "LtE"), ("GtE", "Lt"), ("Eq", "NotEq"), ("NotEq", "Eq"), ("Is", "IsNot"),
    ("IsNot", "Is"), ("In", "NotIn"), ("NotIn", "In"),
}  # fmt: skip


def _kept_operator(name: str) -> bool:
    op = name.removeprefix("core/")
    for prefix, kept in (("ReplaceBinaryOperator_", _BINARY_KEPT),
                         ("ReplaceComparisonOperator_", _COMPARE_KEPT)):  # fmt: skip
        if op.startswith(prefix):
            src, _, dst = op.removeprefix(prefix).partition("_")
            return (src, dst) in kept
    return not op.startswith(("VariableInserter", "VariableReplacer"))


def _annotation_spans(tree: ast.AST) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    spans = []
    for node in ast.walk(tree):
        notes: list[ast.expr | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            notes.append(node.returns)
        elif isinstance(node, ast.arg | ast.AnnAssign):
            notes.append(node.annotation)
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            notes.append(node.test)  # `if not TYPE_CHECKING:` only imports a name early
        for n in notes:
            if n is not None and n.end_lineno is not None and n.end_col_offset is not None:
                spans.append(((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)))
    return spans


def _scope_lines(tree: ast.Module, names: tuple[str, ...]) -> list[tuple[int, int]]:
    return [
        (node.lineno, node.end_lineno or node.lineno)
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.name in names
    ]


def _prune(db: Path, source: Path, module: Module, shard: tuple[int, int] = (0, 1)) -> None:
    """Drop the mutants that are noise: unkept operators, annotations, out-of-scope lines."""
    tree = ast.parse(source.read_text())
    notes = _annotation_spans(tree)
    scope = _scope_lines(tree, module.scope) if module.scope else None
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "select job_id, operator_name, start_pos_row, start_pos_col from mutation_specs"
        ).fetchall()
        drop = []
        for n, (job, op, row, col) in enumerate(sorted(rows, key=lambda r: (r[2], r[3], r[1]))):
            if n % shard[1] != shard[0]:
                drop.append(job)
                continue
            noise = not _kept_operator(op) or any(a <= (row, col) < b for a, b in notes)
            outside = scope is not None and not any(lo <= row <= hi for lo, hi in scope)
            if noise or outside:
                drop.append(job)
        conn.executemany("delete from mutation_specs where job_id = ?", [(j,) for j in drop])
        conn.executemany("delete from work_items where job_id = ?", [(j,) for j in drop])


def _copy_tree(dest: Path) -> None:
    for name in ("src", "tests", "pyproject.toml"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)


def _test_command(module: Module, timeout_s: float) -> str:
    return (
        f"{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly "
        f"--timeout {max(1, int(timeout_s))} {' '.join(module.tests)}"
    )


def _config(module: Module, timeout_s: float) -> str:
    return (
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module.path)}\n"
        f"timeout = {timeout_s}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(_test_command(module, timeout_s))}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )


class BaselineFailed(Exception):
    """The module's tests fail on the unmutated copy: every mutant would count as killed."""


def _baseline(
    module: Module, work: Path, env: dict[str, str], timeout_s: float | None, nice: int = 19
) -> float:
    """Run the tests once, unmutated; returns the per-mutant timeout.

    A mutant that makes the tests hang (a loop that never ends) is killed by the timeout; a
    fixed two-minute timeout makes each such mutant cost two minutes, so the default is
    derived from the baseline instead: 4x its duration plus 10 s for a loaded machine.
    """
    started = time.monotonic()
    argv = shlex.split(_test_command(module, timeout_s or 600))
    done = subprocess.run(["nice", "-n", str(nice), *argv], cwd=work, env=env, capture_output=True,
                          text=True)  # fmt: skip
    took = time.monotonic() - started
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise BaselineFailed(f"{module.path}: its tests fail before any mutation:\n{tail}")
    return timeout_s if timeout_s is not None else round(4 * took + 10)


@dataclass
class Score:
    name: str
    total: int
    killed: int
    survivors: list[tuple[int, str, str]]

    @property
    def percent(self) -> float:
        return 100.0 * self.killed / self.total if self.total else 100.0


def run_module(
    name: str, work: Path, timeout_s: float | None, shard: tuple[int, int] = (0, 1)
) -> Score:
    module = MODULES[name]
    cfg, db = work / f"{name}.toml", work / f"{name}.sqlite"
    env = {**os.environ, "PYTHONPATH": str(work / "src")}
    cfg.write_text(_config(module, _baseline(module, work, env, timeout_s)))
    cr = [sys.executable, "-m", "cosmic_ray.cli"]
    subprocess.run([*cr, "init", str(cfg), str(db)], cwd=work, env=env, check=True)
    _prune(db, work / module.path, module, shard)
    subprocess.run(["nice", "-n", "19", *cr, "exec", str(cfg), str(db)], cwd=work, env=env,
                   check=True)  # fmt: skip
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "select s.start_pos_row, s.operator_name, r.test_outcome, r.worker_outcome, r.diff "
            "from mutation_specs s join work_results r on r.job_id = s.job_id"
        ).fetchall()
    killed = sum(1 for r in rows if _is_killed(r[2], r[3]))
    survivors = sorted(
        (row, op.removeprefix("core/"), diff or "")
        for row, op, test, worker, diff in rows
        if not _is_killed(test, worker)
    )
    return Score(name, len(rows), killed, survivors)


def tests_fail(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> bool:
    """True when the tests `argv` runs fail, or hang past `timeout_s` (the mutant is killed);
    the whole process group is killed either way, so no test process outlives its mutant.
    Shared by deletion.py and behaviour.py, which run the tests themselves."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return proc.wait(timeout=timeout_s) != 0
    except subprocess.TimeoutExpired:
        return True
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _is_killed(test_outcome: str | None, worker_outcome: str | None) -> bool:
    """A test failed on the mutant, or the mutant hung past the timeout."""
    return (test_outcome or "").upper() == "KILLED" or (worker_outcome or "").upper() == "TIMEOUT"


def _kill_leftovers(work: Path) -> None:
    """Kill what still runs in the private copy after an interrupt.

    cosmic-ray starts each mutant's tests in a session of their own (so that a timeout kills
    the whole group); when cosmic-ray itself is killed, that group is orphaned and would keep
    running a mutant. Its processes are found by their working directory, the copy.
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            pid = int(entry.name)
            if Path(cwd).is_relative_to(work):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone already, or not ours to read


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--behaviour" in argv:
        from behaviour import main as behaviour_main

        return behaviour_main([a for a in argv if a != "--behaviour"])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    parser.add_argument("--list", action="store_true", help="show modules and their tests")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant (default: 4x the unmutated test run + 10 s)",
    )
    parser.add_argument("--min-score", type=float, default=0.0,
                        help="exit 1 when a module kills fewer than this percent")  # fmt: skip
    parser.add_argument(
        "--shard",
        default="0/1",
        metavar="I/N",
        help="run every N-th mutant from the I-th (0-based): split across machines",
    )
    parser.add_argument("--survivors", type=Path, default=Path("mutation-survivors.txt"))
    parser.add_argument(
        "--behaviour",
        action="store_true",
        help="behaviour mutants instead of cosmic-ray's (scripts/behaviour.py)",
    )
    args = parser.parse_args(argv)
    if args.list:
        for name, m in MODULES.items():
            print(f"{name:8} {m.path}  <- {' '.join(m.tests)}")
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        print(f"unknown module {unknown[0]!r}; choose from {', '.join(MODULES)}", file=sys.stderr)
        return 2
    index, _, count = args.shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        print(f"--shard {args.shard!r} must be I/N with 0 <= I < N, e.g. 0/2", file=sys.stderr)
        return 2
    shard = (int(index), int(count))
    if args.timeout is not None and not args.timeout > 0:
        print(f"--timeout {args.timeout:g} must be a number of seconds > 0", file=sys.stderr)
        return 2
    if shutil.which("nice") is None:
        print("mutation testing runs its mutants under `nice`, which is not on PATH",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        print("cosmic-ray is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C: the running mutant's test process is killed and the private
    # copy is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scores = []
    with tempfile.TemporaryDirectory(prefix="metrale-mutation-") as tmp:
        work = Path(tmp).resolve()
        _copy_tree(work)
        try:
            for name in args.modules or list(MODULES):
                started = time.monotonic()
                try:
                    score = run_module(name, work, args.timeout, shard)
                except BaselineFailed as exc:
                    print(exc, file=sys.stderr)
                    return 1
                took = time.monotonic() - started
                print(f"{name}: {score.killed}/{score.total} killed ({score.percent:.1f}%) "
                      f"in {took:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
                scores.append(score)
        finally:
            _kill_leftovers(work)
    print("| module | file | mutants | killed | score |")
    print("| --- | --- | --- | --- | --- |")
    for s in scores:
        print(f"| {s.name} | {MODULES[s.name].path} | {s.total} | {s.killed} | {s.percent:.1f}% |")
    with args.survivors.open("w") as out:
        for s in scores:
            for row, op, diff in s.survivors:
                out.write(f"== {s.name} {MODULES[s.name].path}:{row} {op}\n{diff}\n")
    return 1 if any(s.percent < args.min_score for s in scores) else 0


if __name__ == "__main__":
    sys.exit(main())
