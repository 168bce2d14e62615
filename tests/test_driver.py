"""The rollout driver (`RolloutBenchmark`) in process: a toy benchmark through the lifecycle the
runner drives (configure, load, next until final, cleanup) with a real run directory and,
for one test, the real subprocess runtime. What is checked is what a user reads: the final
result's status, numbers, table and logs, the records on disk, the progress calls.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from metrale.endpoint.client import ClientOptions
from metrale.errors import UsageError
from metrale.plugin import Descriptor, Metric, ParamSpec, PluginHandle, Status
from metrale.rollout import RolloutBenchmark, RolloutContext, Tokens, bound_check
from metrale.rundir import RunArtifacts
from metrale.runtime.base import Capability
from metrale.runtime.configs import runtime_config


class Boom(Exception):
    kind = "boom"


class Task:
    """Rollout i: reward 1, 0, 1 for i = 0, 1, 2; rollout 3 fails in generation."""

    def __init__(self, index: int) -> None:
        self.index = index

    async def setup(self, ctx: RolloutContext) -> None:
        ctx.record.tokens = Tokens(prompt=3, completion=5, source="usage")
        if self.index == 0:
            ctx.record.tokens = Tokens(prompt=2, completion=7, source="counted")

    async def generate(self, ctx: RolloutContext) -> None:
        if self.index == 3:
            raise Boom("no answer")
        ctx.record.metrics["steps"] = 2 * self.index

    async def score(self, ctx: RolloutContext) -> None:
        ctx.record.reward = 0.0 if self.index == 1 else 1.0


class Toy(RolloutBenchmark):
    descriptor = Descriptor(id="toy", name="Toy", summary="four rollouts, one fails")
    default_rollouts = 4
    max_rollouts = 10
    extra_axes = ("level",)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def needs_model(self) -> bool:
        return False

    def extra_parameters(self) -> list[ParamSpec]:
        return [ParamSpec(name="level", type="int", default=1, help="a toy knob")]

    def task_metrics(self) -> list[Metric]:
        return [
            Metric("steps", "steps", "lower", "steps per rollout", stat="max",
                   value=lambda r: r.metrics.get("steps"), column=True),
        ]  # fmt: skip

    def make_task(self, index: int) -> Task:
        return Task(index)

    def on_rollout(self, record: Any) -> None:
        self.seen.append(record.index)


@dataclass
class Resumed:
    indices: frozenset[int]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def records(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)


def drive(bench: Toy, run_dir: Path, **handle: Any) -> tuple[Any, list[tuple[int, int | None]]]:
    progress: list[tuple[int, int | None]] = []

    async def main() -> Any:
        artifacts = RunArtifacts(run_dir)
        artifacts.open()
        h = PluginHandle(target=None, artifacts=artifacts, client_options=ClientOptions(),
                         on_progress=lambda done, total: progress.append((done, total)),
                         **handle)  # fmt: skip
        await bench.load(h)
        try:
            for _ in range(400):  # 0.25 s a poll: 100 s at most
                result = await bench.next()
                if result.status != Status.RUNNING:
                    return result
            raise AssertionError("the toy run did not end")
        finally:
            await bench.cleanup()

    return asyncio.run(main()), progress


def records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "rollouts.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["index"])


def test_a_run_reports_its_numbers_table_and_failures(tmp_path: Path) -> None:
    bench = Toy()
    bench.configure({})
    assert bench.values["rollouts"] == 4 and bench.values["max_concurrent"] is None
    result, progress = drive(bench, tmp_path)
    assert result.status == Status.COMPLETED and result.error is None
    assert (result.done, result.total) == (4, 4)
    assert sorted(bench.seen) == [0, 1, 2, 3]
    assert progress == [(1, 4), (2, 4), (3, 4), (4, 4)]
    m = result.metrics
    assert m["reward_mean"] == pytest.approx(2 / 3) and m["error_rate"] == 0.25
    assert (m["errors"], m["retries"], m["steps"]) == (1, 0, 4)
    assert (m["rollouts"], m["runtime_retries"], m["tokens_counted"]) == (4, 0, 1)
    assert (m["prompt_tokens"], m["completion_tokens"]) == (11, 22)
    assert result.measured.records == 4 and result.measured.errors == 1
    assert list(result.stages) == ["setup", "generation", "scoring", "total"]
    assert result.table.columns[1:3] == ["err", "rew"]
    assert result.table.columns[3].startswith("setup (") and result.table.columns[-1] == (
        "steps (steps)"
    )
    assert result.table.rows[0][1:3] == [1, "0.667"] and result.table.rows[0][-1] == "4"
    row = result.table.rows[0]
    assert len(row) == len(result.table.columns) == 8
    assert all(re.fullmatch(r"[0-9.]+ \([0-9.]+–[0-9.]+\)", str(c)) for c in row[3:7]), row
    assert result.summary.startswith("4 rollouts, 1 errors, reward 0.667, e2e ")
    assert [(log.level, log.message) for log in result.logs] == [
        ("warn", "failed rollouts: boom x1")
    ]
    on_disk = records(tmp_path)
    assert [r["index"] for r in on_disk] == [0, 1, 2, 3]
    assert on_disk[3]["error"] == {"type": "boom", "message": "no answer", "stage": "generation"}
    assert all(r["id"] == f"{tmp_path.name}-{r['index']}" and r["runtime"] is None for r in on_disk)


def test_the_live_view_counts_what_has_finished(tmp_path: Path) -> None:
    bench = Toy()
    bench.configure({"rollouts": 4})
    live = bench.live()
    assert (live.status, live.phase, live.done, live.total) == (Status.RUNNING, "rollouts", 0, 4)
    assert live.summary == "0/4 rollouts · 0 errors · reward -"
    assert live.running_p50_s == {} and live.reward_mean is None
    drive(bench, tmp_path)
    after = bench.live()
    assert after.summary == "4/4 rollouts · 1 errors · reward 0.667"
    assert (after.errors, after.retries) == (1, 0)
    assert set(after.running_p50_s) == {"generation", "total"}


def test_a_run_that_finished_no_rollout_has_failed() -> None:
    bench = Toy()
    bench.configure({})
    result = bench.final()
    assert result.status == Status.FAILED and result.error == "no rollout ran"


def test_a_resumed_run_runs_only_the_missing_rollouts(tmp_path: Path) -> None:
    kept = [
        {"id": "old-0", "benchmark": "toy", "index": 0, "started_at": 1.0, "reward": 0.5},
        {"id": "old-1", "benchmark": "toy", "index": 1, "started_at": 1.0, "reward": 0.5},
        {"id": "old-9", "benchmark": "toy", "index": 9, "started_at": 1.0, "reward": 0.5},
    ]
    bench = Toy()
    bench.configure({})
    result, progress = drive(bench, tmp_path, resume=Resumed(frozenset({0, 1}), kept))
    assert sorted(bench.seen) == [2, 3]  # 0 and 1 kept; 9 is not one of the kept indices
    assert progress == [(3, 4), (4, 4)]
    assert result.done == 4 and result.metrics["reward_mean"] == pytest.approx(2 / 3)
    assert result.metrics["tokens_counted"] == 0  # rollouts 2 and 3 had the server's usage
    assert [r["index"] for r in records(tmp_path)] == [2, 3]


def test_rollouts_run_in_the_runtime_the_run_names(tmp_path: Path) -> None:
    bench = Toy()
    bench.configure({"rollouts": 2, "max_concurrent": 1})
    result, _ = drive(bench, tmp_path, runtime=runtime_config("subprocess"))
    assert result.status == Status.COMPLETED and result.done == 2
    assert [r["runtime"] for r in records(tmp_path)] == ["subprocess", "subprocess"]
    assert all(r["stop_s"] is not None and r["setup_wait_s"] is not None for r in records(tmp_path))
    assert list(result.stages) == ["setup_wait", "setup", "generation", "scoring", "stop", "total"]


def test_a_run_says_its_phase_as_it_enters_it(tmp_path: Path) -> None:
    statuses: list[str] = []
    bench = Toy()
    bench.configure({})
    result, _ = drive(bench, tmp_path, on_status=statuses.append)
    assert result.status == Status.COMPLETED
    assert statuses[:2] == ["load", "rollouts"]


def test_a_runtime_this_machine_cannot_give_fails_the_load_before_any_rollout(
    tmp_path: Path,
) -> None:
    bench = Toy()
    bench.configure({})
    no_cli = runtime_config("docker", cli="metrale-no-such-docker")
    with pytest.raises(UsageError, match="'metrale-no-such-docker' is not on PATH"):
        drive(bench, tmp_path, runtime=no_cli)
    assert bench.seen == [] and not (tmp_path / "rollouts.jsonl").read_text()


def test_a_benchmark_without_a_warm_pool_refuses_one() -> None:
    class Preparing(Toy):
        warm_pool = False

    pooled = runtime_config("subprocess", pool=2)
    assert Toy().runtime_choice(pooled) is pooled
    with pytest.raises(UsageError) as info:
        Preparing().runtime_choice(pooled)
    assert str(info.value).startswith("--runtime-pool: toy prepares each sandbox's files")
    assert Preparing().runtime_choice(runtime_config("subprocess")) is not None


def test_parameters_and_axes() -> None:
    bench = Toy()
    rollouts, concurrent, level = bench.parameters()
    assert (rollouts.name, rollouts.default, rollouts.min, rollouts.max) == ("rollouts", 4, 1, 10)
    assert (concurrent.name, concurrent.default, concurrent.min) == ("max_concurrent", None, 1)
    assert concurrent.nullable and not rollouts.nullable and level.name == "level"
    assert bench.sweep_axes() == ["rollouts", "max_concurrent", "level"]
    assert [m.name for m in bench.metrics()][-2:] == ["e2e_s", "steps"]
    for bad in ({"rollouts": 0}, {"rollouts": 11}, {"max_concurrent": 0}):
        with pytest.raises(UsageError):
            bench.configure(bad)


def test_the_runtime_a_benchmark_accepts() -> None:
    class Sandboxed(Toy):
        needs = frozenset({Capability.TASK_IMAGE})
        runtime_reason = "its agent runs shell commands"
        default_runtime = "bwrap"

    assert Toy().runtime_choice(None) is None
    sub = runtime_config("subprocess")
    assert Toy().runtime_choice(sub) is sub
    assert Sandboxed().runtime_choice(None).type == "bwrap"  # type: ignore[union-attr]
    with pytest.raises(UsageError) as info:
        Sandboxed().runtime_choice(sub)
    assert str(info.value) == (
        "toy cannot run in the subprocess runtime (its agent runs shell commands): it lacks "
        "task_image; accepted: bwrap, docker"
    )
    Sandboxed.runtime_reason = ""
    with pytest.raises(UsageError) as info:
        Sandboxed().runtime_choice(sub)
    assert str(info.value) == (
        "toy cannot run in the subprocess runtime: it lacks task_image; accepted: bwrap, docker"
    )
    # a runtime is judged by what it provides, not by its name: ray over bwrap runs images
    over_bwrap = runtime_config("ray", inner="bwrap")
    assert Sandboxed().runtime_choice(over_bwrap) is over_bwrap
    with pytest.raises(UsageError, match="ray runtime.*lacks task_image"):
        Sandboxed().runtime_choice(runtime_config("ray"))

    class Unexplained(Toy):  # says no reason at all: the message has none
        needs = frozenset({Capability.BOUNDS, Capability.HOST_PATHS})

    with pytest.raises(UsageError) as info:
        Unexplained().runtime_choice(sub)
    assert (
        str(info.value)
        == "toy cannot run in the subprocess runtime: it lacks bounds; accepted: bwrap"
    )


def test_a_benchmark_declaring_no_metric_of_its_own_has_the_rollout_ones() -> None:
    class Bare(RolloutBenchmark):
        descriptor = Descriptor(id="bare", name="Bare", summary="declares nothing")

    names = [m.name for m in Bare().metrics()]
    assert names[:4] == ["setup", "generation", "scoring", "total"] and names[-1] == "e2e_s"
    assert Bare().task_metrics() == []


def test_load_runs_the_benchmarks_own_preparation_once(tmp_path: Path) -> None:
    class Preparing(Toy):
        prepared = 0

        async def prepare(self, handle: PluginHandle) -> None:
            type(self).prepared += 1

    bench = Preparing()
    bench.configure({})
    result, _ = drive(bench, tmp_path)
    assert result.status == Status.COMPLETED and Preparing.prepared == 1


@pytest.mark.parametrize(
    ("value", "limit", "op", "passed"),
    [
        (2.0, 2.0, "<=", True),  # inclusive
        (2.001, 2.0, "<=", False),
        (2.0, 2.0, ">=", True),  # inclusive
        (1.999, 2.0, ">=", False),
        (3.0, 2.0, ">=", True),
    ],
)
def test_bound_check_is_inclusive(value: float, limit: float, op: str, passed: bool) -> None:
    check = bound_check("turns", value, limit, op)
    assert (check.metric, check.op, check.limit, check.value) == ("turns", op, limit, value)
    assert check.passed is passed and check.reason == ""


def test_bound_check_fails_an_absent_value() -> None:
    check = bound_check("turns", None, 5.0)
    assert (check.op, check.passed, check.value, check.reason) == ("<=", False, None, "absent")


def test_documented_defaults_of_a_rollout_benchmark() -> None:
    class Plain(RolloutBenchmark):
        descriptor = Descriptor(id="plain", name="Plain", summary="defaults only")

    rollouts = Plain().parameters()[0]
    assert (rollouts.default, rollouts.max) == (64, 1_000_000)
    assert Plain.resumable is True and Plain.keep_records is False
    assert Plain.needs == frozenset() and Plain.default_runtime is None and Plain.extra_axes == ()
