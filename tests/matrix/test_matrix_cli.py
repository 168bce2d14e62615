"""`metrale matrix / report / plot / compare` end to end, against a real `metrale sim`."""

from __future__ import annotations

import csv
import io
import json
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale.matrix.cellfile import read_cell, read_cells
from metrale.rollout import SUMMARY_STAGES
from tests.conftest import Sim, run_cli, start_sim

#: Two real runtimes the sweep runs through: gsm8k grades inside each rollout's sandbox.
RUNTIMES = ("subprocess", "bwrap")
ROLLOUTS = (3, 5)
CAPS = ("none", "2")
CELLS = sorted(
    f"{rt}-r{r}" + ("" if c == "none" else f"-c{c}")
    for rt in RUNTIMES
    for r in ROLLOUTS
    for c in CAPS
)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sim, Path, str]]:
    out = tmp_path_factory.mktemp("sweep") / "results"
    with start_sim("--ttft", "0.01") as sim:
        proc = run_cli([
            "matrix", "gsm8k", "--target", sim.url, "--runtime", ",".join(RUNTIMES),
            "--rollouts", ",".join(map(str, ROLLOUTS)), "--max-concurrent", ",".join(CAPS),
            "-p", "max_tokens=8", "--out", str(out),
        ])  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        yield sim, out, proc.stdout


def test_sweep_writes_one_file_per_cell_with_the_fields(sweep) -> None:  # type: ignore[no-untyped-def]
    sim, out, stdout = sweep
    assert sorted(p.name for p in out.glob("*.json")) == sorted(f"{c}.json" for c in CELLS)
    lines = stdout.splitlines()
    assert len(lines) == 8 and lines[0].startswith("[1/8] ") and lines[-1].startswith("[8/8] ")
    for name in CELLS:
        data = json.loads((out / f"{name}.json").read_text())
        runtime, r, *cap = name.split("-")
        assert data["cell"] == name and data["benchmark"] == "gsm8k"
        assert data["runtime"] == runtime and data["rollouts"] == int(r[1:])
        if cap:
            assert data["max_concurrent"] == int(cap[0][1:])
        else:
            assert "max_concurrent" not in data
        assert data["runtime_config"]["type"] == runtime
        assert data["target"] == sim.url and data["model"] == "metrale-sim"
        assert data["metrale_version"] and data["started_at"].startswith("20")
        assert data["status"] == "completed" and data["error"] is None
        assert data["e2e_s"] > 0 and data["errors"] == 0 and data["reward_mean"] == 0.0
        assert data["params"]["max_tokens"] == 8
        for stage in SUMMARY_STAGES:
            values = data["durations"][stage]
            assert len(values) == data["rollouts"] and values == sorted(values)
        assert min(data["durations"]["generation"]) >= 0.01  # the sim's time to first token
        run_dir = out / "runs" / name
        assert len((run_dir / "rollouts.jsonl").read_text().splitlines()) == data["rollouts"]
        assert (run_dir / "result.json").is_file()


def test_rerunning_one_cell_changes_only_its_file(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim, out, _ = sweep
    copy = tmp_path / "results"
    shutil.copytree(out, copy)
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in copy.glob("*.json")}
    time.sleep(0.05)
    target_cell = f"{RUNTIMES[1]}-r3-c2"
    proc = run_cli([
        "matrix", "gsm8k", "--target", sim.url, "--runtime", ",".join(RUNTIMES),
        "--rollouts", ",".join(map(str, ROLLOUTS)), "--max-concurrent", ",".join(CAPS),
        "-p", "max_tokens=8", "--out", str(copy), "--only", target_cell, "--no-preflight",
    ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"[1/1] {target_cell} ")
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in copy.glob("*.json")}
    assert set(after) == set(before)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {f"{target_cell}.json"}
    assert (
        read_cell(copy / f"{target_cell}.json").started_at
        > json.loads(before[f"{target_cell}.json"][1])["started_at"]
    )


def test_report_is_the_files_numbers(sweep) -> None:  # type: ignore[no-untyped-def]
    _, out, _ = sweep
    cells = {c.cell: c for c in read_cells(out)}
    proc = run_cli(["report", str(out)])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    names = [h.partition(" (")[0] for h in header]
    # sandboxed rollouts: their start-slot wait before setup, their sandbox's stop after scoring
    shown = ("setup_wait", "setup", "generation", "scoring", "stop", "total")
    assert names == ["cell", "conc", "e2e", "err", "rew", *shown]
    units = {n: h.partition(" (")[2].rstrip(")") for n, h in zip(names, header, strict=True)}
    assert all(units[n] in ("µs", "ms", "s") for n in ("e2e", *shown)), header
    assert set(lines[1]) <= {"|", "-"}
    rows = [[x.strip() for x in line.strip("|").split("|")] for line in lines[2:]]
    assert sorted(r[0] for r in rows) == CELLS
    for row in rows:
        c = cells[row[0]]
        assert row[1] == ("∞" if c.max_concurrent is None else str(c.max_concurrent))
        assert c.e2e_s is not None
        assert_sig3(row[2], c.e2e_s * SCALE[units["e2e"]])
        assert row[3] == "0" and row[4] == "0"
        for text, stage in zip(row[5:], shown, strict=True):
            assert_spread_text(text, [x * SCALE[units[stage]] for x in c.durations[stage]])
    csv_proc = run_cli(["report", str(out), "--csv"])
    parsed = list(csv.DictReader(io.StringIO(csv_proc.stdout)))
    assert sorted(r["cell"] for r in parsed) == CELLS
    for r in parsed:
        c = cells[r["cell"]]
        assert r["max_concurrent"] == ("" if c.max_concurrent is None else str(c.max_concurrent))
        assert float(r["e2e_s"]) == c.e2e_s
        for stage in shown:
            values = c.durations[stage]
            assert float(r[f"{stage}_p50_s"]) == pytest.approx(statistics.median(values))


def test_plot_writes_a_png_of_four_panels(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import matplotlib.image

    from metrale.matrix.plot import build_figure

    _, out, _ = sweep
    png = tmp_path / "sweep.png"
    proc = run_cli(["plot", str(out), "-o", str(png)])
    assert proc.returncode == 0, proc.stderr
    fig = build_figure(read_cells(out))
    assert len(fig.axes) == 4
    assert all(len(ax.patches) == 8 for ax in fig.axes)
    width, height = fig.canvas.get_width_height()
    assert matplotlib.image.imread(png).shape[:2] == (height, width)
    assert f"({width}x{height} px)" in proc.stderr


def test_compare_same_and_worse_from_run_directories(tmp_path: Path) -> None:
    """Two runs against one sim are one distribution; a sim 4x slower to first token is worse."""
    runs = {}
    with start_sim("--ttft", "0.1") as fast, start_sim("--ttft", "0.4") as slow:
        for name, sim in (("a", fast), ("b", fast), ("slow", slow)):
            proc = run_cli([
                "run", "gsm8k", "--target", sim.url, "--rollouts", "12", "--max-tokens", "8",
                "--no-preflight", "--out", str(tmp_path / name),
            ])  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            runs[name] = tmp_path / name
    # Two runs of one sim differ by the machine's noise: the tolerance is the widest relative
    # p10–p90 spread measured within the runs themselves, not a fixed few ms.
    tolerance = noise_tolerance(runs["a"], runs["b"])
    core = ",".join([*SUMMARY_STAGES, "error_rate", "reward_mean"])
    same = run_cli(["compare", str(runs["a"]), str(runs["b"]), "--tolerance", f"{tolerance:.4f}",
                    "--metric", core])  # fmt: skip
    assert same.returncode == 0, same.stdout + same.stderr
    assert "6 rows: 6 same, 0 better, 0 worse" in same.stdout
    verdicts = compare_csv(runs["a"], runs["b"], "--tolerance", f"{tolerance:.4f}")
    assert {k: verdicts[k] for k in core.split(",")} == dict.fromkeys(core.split(","), "same")
    assert verdicts["e2e_s"] == "n/a"  # one observation a side: no interval
    worse = run_cli(["compare", str(runs["a"]), str(runs["slow"])])
    assert worse.returncode == 1, worse.stdout + worse.stderr
    verdicts = compare_csv(runs["a"], runs["slow"])
    assert verdicts["generation"] == "worse" and verdicts["total"] == "worse"
    assert verdicts["ttft_s"] == "worse"  # a declared metric of gsm8k, from its records
    bad = run_cli(["compare", str(runs["a"]), str(runs["b"]), "--metric", "no_such"])
    assert bad.returncode == 2 and "accepted: setup, generation" in bad.stderr


def compare_csv(a: Path, b: Path, *extra: str) -> dict[str, str]:
    proc = run_cli(["compare", str(a), str(b), "--csv", *extra])
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    return {r["metric"]: r["verdict"] for r in rows}


def noise_tolerance(*run_dirs: Path) -> float:
    """max over stages of (p90 − p10) / p50 of the runs' pooled durations, within 5%..95%
    (compare accepts a relative tolerance below 1)."""
    pooled: dict[str, list[float]] = {s: [] for s in SUMMARY_STAGES}
    for run_dir in run_dirs:
        for line in (run_dir / "rollouts.jsonl").read_text().splitlines():
            record = json.loads(line)
            for stage, timing in record["stages"].items():
                pooled[stage].append(timing["duration_s"])
            pooled["total"].append(record["total_s"])
    ratios = []
    for values in pooled.values():
        deciles = statistics.quantiles(values, n=10, method="inclusive")
        ratios.append((deciles[-1] - deciles[0]) / statistics.median(values))
    return min(0.95, max(0.05, *ratios))


SCALE = {"µs": 1e6, "ms": 1e3, "s": 1.0}


def assert_sig3(shown: str, expected: float) -> None:
    """`shown` is `expected` to three significant figures (off by at most half a unit in the
    third figure: 0.5% of the value)."""
    assert "e" not in shown, shown
    assert abs(float(shown) - expected) <= 0.005 * abs(expected) + 1e-12, (shown, expected)


def assert_spread_text(text: str, values: list[float]) -> None:
    """`p50 (p10–p90)` agrees, to three significant figures, with percentiles computed here by
    the standard library (inclusive quantiles = linear interpolation between closest ranks)."""
    p50_text, _, rest = text.partition(" (")
    p10_text, _, p90_text = rest.rstrip(")").partition("–")
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    for shown, expected in ((p50_text, statistics.median(values)), (p10_text, deciles[0]),
                            (p90_text, deciles[-1])):  # fmt: skip
        assert_sig3(shown, expected)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["matrix", "gsm8k", "--runtime", "none,nosuch"], "unknown runtime 'nosuch'"),
        (["matrix", "gsm8k", "--max-concurrent", "0"], "is not a concurrency cap"),
        (["matrix", "gsm8k", "--rollouts", "two"], "is not a rollout count"),
        (["matrix", "--config", "{toml}"], "is not valid TOML"),
        (["report", "{empty}"], "holds no cell files"),
        (["plot", "{empty}", "-o", "x.png"], "nothing to plot"),
        (["plot", "{empty}", "-o", "x.jpg"], "accepted: .png, .svg, .pdf"),
        (["report", "{empty}", "--csv", "--json"], "not allowed with argument"),
        (["compare", "{empty}", "{empty}"], "holds no cell files"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("rollouts = [4,\n")
    (tmp_path / "empty").mkdir()
    argv = [a.format(toml=bad, empty=tmp_path / "empty") for a in args]
    proc = run_cli(argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("results"))  # nothing ran
