"""A metric's sample while rollouts run: exact totals over every rollout, at most `cap` values
kept, a uniform and reproducible sample past it; memory flat in the rollouts done."""

from __future__ import annotations

from metrale.plugin.metrics import Metric
from metrale.rollout import Progress, RolloutRecord
from metrale.rollout.reservoir import Reservoir
from metrale.rollout.summary import ROLLOUT_METRICS, build_summary, sampled


def test_up_to_the_cap_every_value_is_kept_in_order() -> None:
    r = Reservoir("setup", cap=4)
    for x in (3.0, 1.0, 2.0, 5.0):
        r.add(x)
    assert list(r.values) == [3.0, 1.0, 2.0, 5.0] and not r.sampled
    assert r.statistic("p50") == 2.5 and r.statistic("max") == 5.0


def test_past_the_cap_totals_stay_exact_and_only_cap_values_are_kept() -> None:
    r = Reservoir("reward", cap=100)
    for i in range(10_000):
        r.add(float(i % 2))  # 5,000 ones
    assert len(r) == 100 and r.n == 10_000 and r.sampled
    assert r.statistic("mean") == 0.5
    assert r.statistic("sum") == 5000.0
    assert r.statistic("max") == 1.0
    peak = Reservoir("scoring", cap=8)
    for i in range(1000):
        peak.add(1000.0 if i == 3 else float(i % 10))  # one peak, early, among 1,000
    assert 1000.0 not in peak.values  # the sample lost it; the maximum is exact all the same
    assert peak.statistic("max") == 1000.0
    ratio = Reservoir("tokens_per_s", width=2, cap=10)
    for i in range(1, 1001):
        ratio.add((float(i), 2.0))
    assert len(ratio) == 10 and len(ratio.kept()) == 10
    assert ratio.statistic("ratio") == 500500.0 / 2000.0


def test_the_kept_values_are_a_uniform_sample_and_the_same_each_time() -> None:
    def fill(name: str) -> Reservoir:
        r = Reservoir(name, cap=2000)
        for i in range(100_000):
            r.add(i / 100_000)  # uniform on [0, 1): the true p10/p50/p90 are 0.1/0.5/0.9
        return r

    a, b = fill("total"), fill("total")
    assert list(a.values) == list(b.values)  # seeded by the name: reproducible
    kept = sorted(a.values)
    # a uniform sample of 2,000 puts each decile within 0.03 of its true place (the seed is
    # fixed, so this is one fixed draw, not a flaky one)
    for q, true in ((0.1, 0.1), (0.5, 0.5), (0.9, 0.9)):
        assert abs(kept[int(q * len(kept))] - true) < 0.03
    # late values get in, not only the first ones
    assert sum(1 for x in a.values if x >= 0.5) > 800


def test_a_summary_past_the_cap_says_which_samples_are_samples() -> None:
    metrics = [
        *ROLLOUT_METRICS,
        Metric("flag", "x", "higher", "always 1", stat="mean", value=lambda r: 1.0),
    ]
    progress = Progress(keep_records=False, metrics=sampled(metrics))
    small_cap = 50  # the stages' reservoirs made small; the metrics' keep the default cap
    for key in list(progress.durations):
        progress.durations[key] = Reservoir(key, cap=small_cap)
    for i in range(200):
        record = RolloutRecord(id=str(i), benchmark="fake", index=i, started_at=0.0, reward=1.0,
                               total_s=float(i))  # fmt: skip
        progress.add(record)
    summary = build_summary(progress, metrics, e2e_s=12.5)
    assert summary.e2e_s == 12.5 and summary.metrics["e2e_s"] == 12.5  # the run's, not a sample
    assert summary.sampled["total"] == 200
    assert len(summary.durations["total"]) == small_cap
    assert summary.metrics["flag"] == 1.0 and summary.reward_mean == 1.0
    assert summary.metrics["errors"] == 0
    assert "flag" not in summary.sampled and summary.samples["flag"] == {
        "values": [1.0], "counts": [200],
    }  # fmt: skip


def test_the_default_cap_is_16384_values() -> None:
    r = Reservoir("generation")
    for i in range(16_385):
        r.add(float(i))
    assert len(r) == 16_384 and r.n == 16_385 and r.sampled
    assert r.statistic("sum") == 16_384 * 16_385 / 2


def test_each_percentile_reads_its_own_rank() -> None:
    r = Reservoir("total")
    for i in range(101):
        r.add(float(100 - i))  # 100 down to 0: kept in arrival order, sorted to read
    assert [r.statistic(s) for s in ("p50", "p90", "p99", "max", "mean")] == [
        50.0, 90.0, 99.0, 100.0, 50.0,
    ]  # fmt: skip
    assert Reservoir("empty").statistic("mean") is None
    ratio = Reservoir("rate", width=2)
    ratio.add((3.0, 0.0))
    assert ratio.statistic("ratio") is None  # no denominator yet
