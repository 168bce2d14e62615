"""What a user reads, checked against what the rollouts did: every stage and every count lands
under its own name with its own value, from the records through the summary into the run's
table, `metrale report` (table, CSV/JSON export) and `metrale compare`.

The values are chosen so that a mix-up shows: each stage has a duration no other stage has (two
stages swapped move both columns), the failed rollouts all fail the same way (a count of error
kinds would read 1, not 5), and the per-rollout counts differ from rollout to rollout (a count of
distinct values, or a rollout counted twice, changes the sum).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from metrale.benchmarks.gsm8k.benchmark import Gsm8kBenchmark
from metrale.matrix.cellfile import CellResult, write_cell
from metrale.matrix.compare import compare_cells, compare_paths
from metrale.matrix.report import export_rows, report_table
from metrale.plugin import RunSummary
from metrale.rollout import (
    ROLLOUT_METRICS,
    Progress,
    RolloutRecord,
    build_summary,
    shown_stages,
    summarize_records,
)
from metrale.rollout.records import ErrorInfo, StageTiming, Tokens
from metrale.rollout.summary import sampled
from metrale.stats import Spread
from tests.conftest import Sim, run_cli

#: Each stage's median duration (seconds): no two alike, none a multiple of another's digits.
STAGE_P50 = {
    "pool_start": 0.29,
    "setup_wait": 0.0063,
    "setup": 0.021,
    "generation": 0.43,
    "scoring": 0.0017,
    "stop": 0.087,
    "total": 0.52,
}
#: Rollout i's durations are the median times SPREAD[i]: the 4th of 7 is the median itself.
SPREAD = (0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3)
N = len(SPREAD)
#: Per rollout: retries, sandbox starts retried, prompt and completion tokens, agent turns.
RETRIES = (2, 0, 1, 0, 3, 0, 4)  # sum 10, 5 distinct values
RUNTIME_RETRIES = (1, 0, 0, 0, 0, 2, 0)  # sum 3
PROMPT = (10, 11, 12, 13, 14, 15, 16)
COMPLETION = (5, 5, 5, 7, 7, 9, 9)  # sum 47, 3 distinct values
TURNS = (1, 1, 2, 2, 3, 3, 3)  # sum 15


def records(failed: int, kind: str = "timeout", scale: float = 1.0) -> list[RolloutRecord]:
    """N rollouts; the first `failed` fail in generation with the same error `kind`."""
    out = []
    for i, k in enumerate(SPREAD):

        def took(stage: str, k: float = k) -> float:
            return STAGE_P50[stage] * k * scale

        stages, start = {}, float(i)
        for name in ("setup", "generation", "scoring"):
            stages[name] = StageTiming(started_at=1e9 + start, start_s=start,
                                       end_s=start + took(name), duration_s=took(name))  # fmt: skip
            start += took(name)
        ok = i >= failed
        out.append(
            RolloutRecord(
                id=f"run-{i}", benchmark="gsm8k", index=i, runtime="bwrap", started_at=1e9 + i,
                stages=stages, total_s=took("total"), setup_wait_s=took("setup_wait"),
                stop_s=took("stop"), pool_start_s=took("pool_start"),
                reward=(1.0 if i % 2 else 0.0) if ok else None,
                tokens=Tokens(prompt=PROMPT[i], completion=COMPLETION[i], source="usage"),
                turns=TURNS[i], retries=RETRIES[i], runtime_retries=RUNTIME_RETRIES[i],
                error=None if ok else ErrorInfo(type=kind, message="read timed out",
                                                stage="generation"),
            )
        )  # fmt: skip
    return out


def summary_of(recs: list[RolloutRecord]) -> tuple[Progress, RunSummary]:
    progress = Progress(keep_records=False, metrics=sampled(ROLLOUT_METRICS))
    for r in recs:
        progress.add(r)
    return progress, build_summary(progress, ROLLOUT_METRICS, e2e_s=3.25)


def cell_of(recs: list[RolloutRecord], name: str = "bwrap-r7") -> CellResult:
    _, summary = summary_of(recs)
    base = CellResult(cell=name, benchmark="gsm8k", runtime="bwrap", rollouts=N)
    cell = base.with_summary(summary)
    cell.declared = [m.declaration() for m in Gsm8kBenchmark().metrics()]  # as a gsm8k run's
    return cell


_UNITS = {"µs": 1e-6, "ms": 1e-3, "s": 1.0}


def p50_seconds(header: str, text: str) -> float:
    """The p50 of a stage cell (`p50 (p10–p90)`) in seconds, from its column's unit."""
    unit = re.fullmatch(r".* \((µs|ms|s)\)", header)
    assert unit is not None, header
    return float(text.split(" ")[0]) * _UNITS[unit.group(1)]


def assert_stage_columns(columns: list[str], row: list[object], scale: float = 1.0) -> None:
    seen = {}
    for header, text in zip(columns, row, strict=True):
        name = header.split(" (")[0]
        if name in STAGE_P50:
            seen[name] = p50_seconds(header, str(text))
    assert set(seen) == set(STAGE_P50), columns
    for name, value in seen.items():
        assert value == pytest.approx(STAGE_P50[name] * scale, rel=0.01), (name, seen)


# --------------------------------------------------------------------------- the summary


@pytest.mark.parametrize("rebuilt", [False, True], ids=["as-run", "from-records"])
def test_every_stage_and_count_lands_under_its_own_name_in_the_summary(rebuilt: bool) -> None:
    recs = records(failed=5)
    if rebuilt:  # a crashed cell's summary, read back from its rollouts.jsonl
        summary = summarize_records(recs, ROLLOUT_METRICS, e2e_s=3.25)
    else:
        progress, summary = summary_of(recs)
        assert (progress.done, progress.errors) == (N, 5)
        assert progress.error_kinds == {"timeout": 5}
        assert progress.retries == sum(RETRIES)
        assert progress.runtime_retries == sum(RUNTIME_RETRIES)
        assert progress.prompt_tokens == sum(PROMPT)
        assert progress.completion_tokens == sum(COMPLETION)
        assert progress.turns == sum(TURNS)
    for name, p50 in STAGE_P50.items():
        spread = Spread.of(summary.stage(name))
        assert spread.n == N, name
        assert spread.p50 == pytest.approx(p50), name
        assert spread.p10 < spread.p50 < spread.p90, name
        assert summary.metrics[name] == pytest.approx(p50), name
    assert summary.records == N
    assert summary.errors == 5  # five timeouts are five errors, not one kind of error
    assert summary.metrics["errors"] == 5
    assert summary.metrics["error_rate"] == pytest.approx(5 / N)
    assert summary.metrics["retries"] == sum(RETRIES)
    assert summary.reward_mean == pytest.approx(0.5)  # rollouts 5 and 6: rewards 0 and 1
    assert summary.e2e_s == 3.25


def test_counts_are_per_rollout_whatever_the_kinds() -> None:
    """The same five failures, each of its own kind, count the same five."""
    mixed = records(failed=5)
    for i, kind in enumerate(("timeout", "http_500", "drop", "malformed", "no_reward")):
        assert mixed[i].error is not None
        mixed[i].error.type = kind
    _, one_kind = summary_of(records(failed=5))
    progress, five_kinds = summary_of(mixed)
    assert len(progress.error_kinds) == 5
    for summary in (one_kind, five_kinds):
        assert summary.errors == 5 and summary.metrics["errors"] == 5
        assert summary.metrics["error_rate"] == pytest.approx(5 / N)


# --------------------------------------------------------------------------- the run's table


def test_the_run_table_shows_each_stage_and_the_error_count() -> None:
    _progress, summary = summary_of(records(failed=5))
    bench = Gsm8kBenchmark()
    stages = {s: Spread.of(summary.stage(s)) for s in shown_stages(summary)}
    assert list(stages) == ["pool_start", "setup_wait", "setup", "generation", "scoring",
                            "stop", "total"]  # fmt: skip
    table = bench.table(summary, stages)
    [row] = table.rows
    by_name = dict(zip(table.columns, row, strict=True))
    assert by_name["err"] == 5
    assert_stage_columns(table.columns, row)
    assert "5 errors" in bench.summary_text(summary)


# --------------------------------------------------------------------------- report and compare


def test_report_table_and_export_show_each_stage_and_the_error_count() -> None:
    cell = cell_of(records(failed=5))
    columns, [row] = report_table([cell])
    by_name = dict(zip(columns, row, strict=True))
    assert by_name["err"] == "5"
    assert_stage_columns(columns, row)
    [exported] = export_rows([cell])
    assert exported["errors"] == 5 and exported["records"] == N
    assert exported["error_rate"] == pytest.approx(5 / N)
    assert exported["retries"] == sum(RETRIES)
    for name, p50 in STAGE_P50.items():
        assert exported[f"{name}_p50_s"] == pytest.approx(p50), name


def test_compare_reads_each_metric_of_each_side_under_its_own_name() -> None:
    a = cell_of(records(failed=5))
    b = cell_of(records(failed=1, kind="http_500", scale=2.0))
    compared = compare_cells(a, b, resamples=200)
    # every row, those without a sample too, is this cell's and names a declared metric
    assert {r.cell for r in compared} == {"bwrap-r7"}
    assert {r.metric for r in compared} == {m.name for m in Gsm8kBenchmark().metrics()}
    rows = {r.metric: r for r in compared}
    for name, p50 in STAGE_P50.items():
        assert rows[name].a == pytest.approx(p50), name
        assert rows[name].b == pytest.approx(2 * p50), name
        assert rows[name].verdict == "worse", name
    assert rows["error_rate"].a == pytest.approx(5 / N)
    assert rows["error_rate"].b == pytest.approx(1 / N)
    assert rows["errors"].a == 5 and rows["errors"].b == 1
    assert rows["retries"].a == sum(RETRIES)
    assert not math.isnan(rows["error_rate"].diff or math.nan)


# --------------------------------------------------------------------------- through the CLI


def _table(text: str) -> dict[str, str]:
    """The first row of a plain or Markdown table in `text`, by column."""
    lines = [ln.strip().strip("|") for ln in text.splitlines() if ln.strip()]
    head = next(i for i, ln in enumerate(lines) if " err " in f" {ln} ".replace("|", " "))
    split = (lambda ln: [c.strip() for c in ln.split("|")]) if "|" in text else _plain_cells
    rows = [ln for ln in lines[head + 1 :] if not set(ln) <= set("-| ")]
    return dict(zip(split(lines[head]), split(rows[0]), strict=True))


def _plain_cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_a_run_of_failing_calls_reads_one_error_and_its_own_retries_per_rollout(
    sim: Sim, sim_factory: Callable[..., Sim], tmp_path: Path
) -> None:
    """gsm8k against an endpoint that fails every call with a 5xx, 2 retries each: 5 rollouts
    are 5 errors (of one kind) and 10 retries, in the records, the run's table and summary
    line, summary.json, `metrale report` and `metrale compare` against a healthy run."""
    failing = sim_factory("--error-rate", "1", "--error-kinds", "5xx")
    runs = {}
    for name, target in (("failing", failing), ("healthy", sim)):
        out = tmp_path / name
        proc = run_cli(["run", "gsm8k", "--target", target.url, "--no-preflight",
                        "--rollouts", "5", "--retries", "2", "--runtime", "none",
                        "--out", str(out)], timeout=120)  # fmt: skip
        assert proc.returncode in (0, 3), proc.stderr[-2000:]
        runs[name] = (out, proc)
    out, proc = runs["failing"]
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["retries"] for r in rows] == [2] * 5
    assert {r["error"]["type"] for r in rows} == {"http_500"}
    assert _table(proc.stdout)["err"] == "5"
    assert "5 rollouts, 5 errors" in proc.stderr + proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["records"], summary["errors"]) == (5, 5)
    assert (summary["metrics"]["errors"], summary["metrics"]["retries"]) == (5, 10)
    report = run_cli(["report", str(out)])
    assert report.returncode == 0, report.stderr
    assert _table(report.stdout)["err"] == "5"
    compared = run_cli(["compare", str(out), str(runs["healthy"][0]), "--metric", "errors",
                        "--metric", "error_rate", "--metric", "retries"])  # fmt: skip
    assert compared.returncode in (0, 1), compared.stderr
    by_metric = {_plain_cells(ln)[1]: _plain_cells(ln) for ln in compared.stdout.splitlines()[1:]
                 if len(_plain_cells(ln)) > 3}  # fmt: skip
    assert by_metric["errors"][2:4] == ["5", "0"]
    assert by_metric["error_rate"][2:4] == ["1", "0"]
    assert by_metric["retries"][2:4] == ["10", "0"]
    # the closing line counts rows per verdict: each count is of rows, and they add up
    counts = re.search(r"(\d+) rows: (\d+) same, (\d+) better, (\d+) worse, (\d+) changed",
                       compared.stdout)  # fmt: skip
    assert counts is not None, compared.stdout
    total, *per_verdict = (int(x) for x in counts.groups())
    assert total == 3 and sum(per_verdict) == 3 and int(counts.group(3)) == 3  # all better


def test_counts_read_in_their_own_unit_and_fewer_is_better() -> None:
    """The unit `compare` and `report` print beside each standard count, and the direction
    that makes fewer errors `better` (a unit swapped with a direction would read `higher`)."""
    declared = {m.name: (m.unit, m.better) for m in ROLLOUT_METRICS}
    assert declared["errors"] == ("rollouts", "lower")
    assert declared["error_rate"] == ("fraction", "lower")
    assert declared["retries"] == ("calls", "lower")
    assert declared["reward_mean"] == ("reward", "higher")
    assert declared["e2e_s"] == ("s", "lower")
    for name in STAGE_P50:
        assert declared[name] == ("s", "lower"), name
    a = cell_of(records(failed=5))
    b = cell_of(records(failed=1, kind="http_500"))
    rows = {r.metric: r for r in compare_cells(a, b, resamples=200)}
    assert rows["errors"].verdict == "better" and rows["error_rate"].verdict == "better"
    assert rows["setup"].verdict == "same"


def test_comparing_two_sweeps_keeps_every_cell_under_its_own_name(tmp_path: Path) -> None:
    """Two sweeps of two cells each: every cell's rows are in the comparison, each with that
    cell's own numbers (not the last cell's, not one cell's twice)."""
    failed = {"bwrap-r7": (5, 1), "subprocess-r7": (2, 0)}  # errors in sweep a, in sweep b
    for side in (0, 1):
        out = tmp_path / "ab"[side]
        out.mkdir()
        for name, errors in failed.items():
            write_cell(out, cell_of(records(failed=errors[side]), name=name))
    result = compare_paths(tmp_path / "a", tmp_path / "b", resamples=200)
    by_cell: dict[str, dict[str, object]] = {}
    for row in result.rows:
        by_cell.setdefault(row.cell, {})[row.metric] = row
    assert set(by_cell) == set(failed)
    for name, (in_a, in_b) in failed.items():
        errors = by_cell[name]["errors"]
        assert (errors.a, errors.b) == (in_a, in_b), name  # type: ignore[attr-defined]
