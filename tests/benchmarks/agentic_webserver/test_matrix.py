"""agentic_webserver swept like gsm8k: concurrent agents, one cell file each, a report row each.

Against `metrale sim --replay good.jsonl` (a scripted agent that really builds and serves an
Axum server on `$METRALE_HARNESS_PORT`), in bwrap (a network namespace each) and in subprocess
(the host's ports, shared: each rollout must get its own).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from metrale.benchmarks.agentic_webserver.warm import WarmCache
from metrale.matrix.cellfile import read_cells
from tests.conftest import run_cli, start_sim

pytestmark = pytest.mark.slow
GOOD = resources.files("metrale.benchmarks.agentic_webserver").joinpath("replays/good.jsonl")
#: where good.jsonl's agent detaches its server's output, as the task's prompt shows it; in the
#: subprocess cell (not a sandbox) that is the host's own /tmp
HOST_LOG = Path("/tmp/server.log")


@pytest.fixture
def host_log() -> Iterator[None]:
    """The test leaves nothing behind: the host file the subprocess cell's agents write is
    removed after, unless it was there before."""
    existed = HOST_LOG.exists()
    yield
    if not existed:
        HOST_LOG.unlink(missing_ok=True)


def test_concurrent_agents_sweep_into_cells(
    warm_cargo: WarmCache, tmp_path: Path, host_log: None
) -> None:
    out = tmp_path / "mx"
    with start_sim("--replay", str(GOOD)) as sim:
        done = run_cli(
            ["matrix", "agentic-webserver", "--target", sim.url, "--runtime", "bwrap,subprocess",
             "--rollouts", "3", "--max-concurrent", "none", "--no-preflight", "--out", str(out)],
            timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    cells = {c.cell: c for c in read_cells(out)}
    assert sorted(cells) == ["bwrap-r3", "subprocess-r3"]
    for cell in cells.values():
        assert (cell.records, cell.errors, cell.reward_mean) == (3, 0, 1.0), cell.cell
        assert cell.metrics["webserver_ok"] == 3 and cell.metrics["followed_directions"] == 3
        assert cell.metrics["turns"] == 8 and cell.samples["s_per_turn"]
        # the three agents ran at once: the cell took far less than its rollouts' sum
        assert cell.e2e_s is not None and cell.e2e_s < 0.6 * sum(cell.stage("total"))
        records = [
            json.loads(line)
            for line in (Path(str(cell.run_dir)) / "rollouts.jsonl").read_text().splitlines()
        ]
        assert sorted(r["index"] for r in records) == [0, 1, 2]
        assert {r["runtime"] for r in records} == {cell.runtime}
        assert all(r["metrics"]["webserver_ok"] for r in records)
    report = run_cli(["report", str(out)])
    rows = [line for line in report.stdout.splitlines() if line.startswith("| bwrap") or
            line.startswith("| subprocess")]  # fmt: skip
    assert len(rows) == 2 and "s_per_turn" in report.stdout
    compare = run_cli(["compare", str(out / "bwrap-r3.json"), str(out / "subprocess-r3.json"),
                       "--metric", "reward_mean,turns,s_per_turn", "--csv"])  # fmt: skip
    lines = compare.stdout.splitlines()
    assert lines[0].startswith("cell,metric") and len(lines) == 4
    assert all(line.split(",")[5] != "" for line in lines[1:]), compare.stdout  # intervals


def test_a_runtime_it_cannot_use_is_refused_before_work(tmp_path: Path) -> None:
    done = run_cli(["matrix", "agentic_webserver", "--target", "http://127.0.0.1:9/v1",
                    "--runtime", "none", "--out", str(tmp_path / "mx")])  # fmt: skip
    assert done.returncode == 2 and "needs a runtime" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "mx").exists()
