"""scripts/behaviour.py: the behaviour mutants it makes (each of the issue's hand-made kinds),
that each one compiles and changes only what it names, and its command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import behaviour
from mutation import Module

ROOT = Path(__file__).resolve().parent.parent

SOURCE = """from __future__ import annotations


def add(progress, record):
    if record.error is not None:
        progress.errors += 1
        progress.kinds[record.error.type] = 1
    progress.retries += record.retries
    extra = {"setup_wait": record.setup_wait_s, "stop": record.stop_s}
    return len(progress.kinds), extra


async def start(runtime):
    try:
        await runtime.launch()
    except BaseException:
        runtime.kill()
        await runtime.remove()
        raise
    finally:
        print("starting is over", flush=True)


def show(table, name: str, unit: str):
    return table.column(name, unit)
"""


def _mutants() -> dict[str, list[behaviour.Mutant]]:
    found: dict[str, list[behaviour.Mutant]] = {}
    for m in behaviour.mutants(SOURCE, Module("x.py", ())):
        found.setdefault(m.kind, []).append(m)
    return found


def test_it_makes_each_kind_the_issue_names() -> None:
    found = _mutants()
    changed: dict[str, list[str]] = {kind: [] for kind in found}
    for kind, ms in found.items():
        for m in ms:
            new = behaviour.apply(SOURCE, m)
            compile(new, "x.py", "exec")  # every mutant compiles
            diff = [b for a, b in zip(SOURCE.splitlines(), new.splitlines(), strict=True) if a != b]
            assert diff, m
            changed[kind] += [line.strip() for line in diff]
    # two same-typed values swapped: the durations of two stages, two arguments
    assert '"setup_wait": record.stop_s, "stop": record.setup_wait_s}' in " ".join(
        changed["swap"]
    ).replace("extra = {", "")
    assert "return table.column(unit, name)" in changed["swap"]
    # a field read in place of its sibling (same object, same suffix)
    assert any("record.stop_s" in c and c.count("record.stop_s") == 2 for c in changed["swap"])
    # a cleanup dropped from an error path, each on its own
    assert sorted(changed["cleanup"]) == ["pass", "pass", "pass"]
    whats = [m.what for m in found["cleanup"]]
    assert any("runtime.kill()" in w for w in whats)
    assert any("await runtime.remove()" in w for w in whats)
    # a count replaced by a count of distinct values, or a sum by its last term
    assert "progress.errors = 1" in changed["distinct"]
    assert "progress.retries = record.retries" in changed["distinct"]
    assert "return len(set(progress.kinds)), extra" in changed["distinct"]
    # what runs in the try body itself is not a cleanup
    assert not any("launch" in m.what for m in found["cleanup"])


def test_list_mutants_names_module_line_and_kind() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "behaviour.py"), "--list-mutants", "summary"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(line.startswith("summary:") for line in lines)
    assert any(" swap: " in line for line in lines)
    bad = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mutation.py"), "--behaviour", "no_such"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown module 'no_such'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
