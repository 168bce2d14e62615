"""Cell files: one per cell, replaced atomically and alone; unbounded cap absent."""

from __future__ import annotations

import json
from pathlib import Path

from metrale.matrix.cellfile import read_cell, read_cells, write_cell
from tests.matrix.helpers import make_cell


def test_unbounded_cap_is_absent_and_the_file_round_trips(tmp_path: Path) -> None:
    path = write_cell(tmp_path, make_cell("none-r64"))
    data = json.loads(path.read_text())
    assert "max_concurrent" not in data
    assert read_cell(path) == make_cell("none-r64")
    capped = json.loads(
        write_cell(tmp_path, make_cell("none-r64-c2", max_concurrent=2)).read_text()
    )
    assert capped["max_concurrent"] == 2


def test_writing_a_cell_replaces_only_its_file(tmp_path: Path) -> None:
    write_cell(tmp_path, make_cell("none-r64", seed=1))
    other = write_cell(tmp_path, make_cell("none-r64-c2", max_concurrent=2))
    before = (other.stat().st_mtime_ns, other.read_bytes())
    write_cell(tmp_path, make_cell("none-r64", seed=2))
    assert (other.stat().st_mtime_ns, other.read_bytes()) == before
    assert read_cell(tmp_path / "none-r64.json") == make_cell("none-r64", seed=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["none-r64-c2.json", "none-r64.json"]


def test_cells_read_in_sweep_order(tmp_path: Path) -> None:
    for name, rt, r, c in [
        ("subprocess-r8", "subprocess", 8, None),
        ("bwrap-r8-c2", "bwrap", 8, 2),
        ("bwrap-r8", "bwrap", 8, None),
        ("bwrap-r4", "bwrap", 4, None),
    ]:
        write_cell(tmp_path, make_cell(name, runtime=rt, rollouts=r, max_concurrent=c))
    names = [c.cell for c in read_cells(tmp_path)]
    assert names == ["bwrap-r4", "bwrap-r8", "bwrap-r8-c2", "subprocess-r8"]


def test_a_cells_status_is_the_status_enum(tmp_path: Path) -> None:
    from metrale.plugin import Status

    path = write_cell(tmp_path, make_cell("none-r64", status="failed", error="boom"))
    assert read_cell(path).status is Status.FAILED
    assert json.loads(path.read_text())["status"] == "failed"
