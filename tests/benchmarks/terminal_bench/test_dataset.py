"""A dataset without running it: the pass@k estimator against known values, the per-task
tally and table, choosing a dataset's tasks, and skipping (not failing) a task that cannot
run, unless --strict."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from metrale.benchmarks.terminal_bench.dataset import Tally, is_dataset, load_dataset
from metrale.benchmarks.terminal_bench.task import load_task, refusals
from metrale.errors import UsageError
from metrale.plugin.per_task import TaskSummary, dataset_numbers, per_task_table
from metrale.rollout import ErrorInfo, RolloutRecord, StageTiming
from metrale.stats import pass_at_k
from tests.benchmarks.terminal_bench.helpers import write_dataset, write_task


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 4, 4, 1.0),
        (4, 1, 1, 0.25),
        (4, 1, 4, 1.0),  # one pass among 4 attempts: 4 draws of 4 always include it
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (8, 0, 8, 0.0),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert math.isclose(pass_at_k(n, c, k) or 0.0, expected, abs_tol=1e-12)  # type: ignore[arg-type]
    # it equals the chance that k of the n attempts drawn without replacement hold a pass
    assert math.isclose(
        pass_at_k(n, c, k) or 0.0, 1 - math.comb(n - c, k) / math.comb(n, k), abs_tol=1e-12
    )


def test_pass_at_k_with_fewer_attempts_than_k_has_no_value() -> None:
    assert pass_at_k(3, 1, 4) is None
    with pytest.raises(ValueError, match="passes"):
        pass_at_k(3, 4, 1)


def _record(index: int, reward: float | None, error: str | None = None) -> RolloutRecord:
    timing = StageTiming(started_at=0.0, start_s=0.0, end_s=1.0, duration_s=0.5 + index)
    return RolloutRecord(
        id=f"r-{index}", benchmark="terminal_bench", index=index, started_at=0.0,
        stages={"setup": timing}, reward=reward,
        error=None if error is None else ErrorInfo(type=error, message="m", stage="setup"),
    )  # fmt: skip


def test_the_tally_gives_each_task_its_attempts_passes_errors_and_p50s() -> None:
    tally = Tally(attempts=4, names=["a", "b", "c"], skipped={"c": "gpus = 1"})
    outcomes = {"a": [1.0, 0.0, 1.0, 0.0], "b": [None, None, 0.0, 0.0]}
    for t, (name, rewards) in enumerate(outcomes.items()):
        for i, reward in enumerate(rewards):
            error = "image_build" if reward is None else None
            tally.add(name, _record(t * 4 + i, reward, error))
    a, b, c = tally.summaries()
    assert (a.attempts, a.passed, a.pass_at(1), a.pass_at(4)) == (4, [1, 0, 1, 0], 0.5, 1.0)
    assert math.isclose(a.pass_at(2) or 0, 1 - 1 / 6)
    assert a.stage_p50_s == {"setup": 2.0}  # durations 0.5, 1.5, 2.5, 3.5
    assert (b.attempts, b.pass_at(4), b.errors, b.rewards) == (4, 0.0, {"image_build": 2}, [0, 0])
    assert (c.attempts, c.skipped, c.pass_at(1)) == (0, "gpus = 1", None)
    numbers = dataset_numbers([a, b, c], 4)
    assert numbers == {"tasks": 3, "tasks_skipped": 1, "tasks_solved": 1, "attempts": 4,
                       "pass_at_1": 0.25, "pass_at_k": 0.5}  # fmt: skip
    columns, rows = per_task_table([a, b, c], 4)
    assert columns[:6] == ["task", "attempts", "reward", "pass@1", "pass@4", "errors"]
    assert rows[1][5] == "image_build x2"
    assert rows[2][0] == "c" and rows[2][-1] == "gpus = 1"


def test_a_task_summary_reads_back_from_json() -> None:
    t = TaskSummary(name="x", attempts=2, passed=[1, 0], rewards=[1, 0], errors={"e": 1})
    assert TaskSummary.model_validate_json(t.model_dump_json()) == t


def test_a_dataset_skips_what_cannot_run_and_names_why(tmp_path: Path) -> None:
    data = write_dataset(tmp_path)
    assert is_dataset(str(data)) and not is_dataset(str(data / "sums-right"))
    assert not is_dataset(str(data / "no-toml"))  # one task, missing its task.toml
    entries = {e.name: e for e in load_dataset(str(data), agent="oracle")}
    assert sorted(entries) == ["build-fails", "no-toml", "sums-right", "sums-wrong", "wants-gpu"]
    assert "task.toml is missing" in (entries["no-toml"].skipped or "")
    assert "wants-gpu" in (entries["wants-gpu"].skipped or "")
    assert "gpus = 1" in (entries["wants-gpu"].skipped or "")
    runnable = sorted(n for n, e in entries.items() if e.task is not None)
    assert runnable == ["build-fails", "sums-right", "sums-wrong"]
    with pytest.raises(UsageError, match="--strict: .*2 of 5 tasks cannot run"):
        load_dataset(str(data), strict=True)


def test_tasks_and_task_filter_choose_within_a_dataset(tmp_path: Path) -> None:
    data = write_dataset(tmp_path)
    chosen = load_dataset(str(data), names="sums-wrong,sums-right")
    assert [e.name for e in chosen] == ["sums-wrong", "sums-right"]
    assert [e.name for e in load_dataset(str(data), pattern="sums-*")] == [
        "sums-right", "sums-wrong",
    ]  # fmt: skip
    with pytest.raises(UsageError, match="--tasks: nope not in the dataset"):
        load_dataset(str(data), names="nope")
    with pytest.raises(UsageError, match="--task-filter 'zz\\*' matches no task"):
        load_dataset(str(data), pattern="zz*")
    with pytest.raises(UsageError, match="no task of .* can run"):
        load_dataset(str(data), names="wants-gpu,no-toml")


def test_the_oracle_skips_a_task_with_no_solution(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    write_task(data, "has-one")
    (write_task(data, "none") / "solution" / "solve.sh").unlink()
    entries = {e.name: e for e in load_dataset(str(data), agent="oracle")}
    assert "solution/solve.sh is missing" in (entries["none"].skipped or "")
    assert all(e.skipped is None for e in load_dataset(str(data), agent="nop"))


def test_task_toml_env_workdir_gpus_and_mcp_servers_are_read(tmp_path: Path) -> None:
    task_dir = write_task(tmp_path)
    toml = (task_dir / "task.toml").read_text()
    toml = toml.replace("[verifier]\n", '[verifier]\nenv = { GREETING = "hi", N = 3 }\n')
    toml += 'workdir = "/app"\ngpus = 2\n[[environment.mcp_servers]]\nname = "x"\n'
    toml += '[solution.env]\nTOKEN = "t"\n'
    (task_dir / "task.toml").write_text(toml)
    task = load_task(str(task_dir))
    assert task.verifier_env == {"GREETING": "hi", "N": "3"}
    assert task.solution_env == {"TOKEN": "t"}
    assert task.environment.workdir == "/app"
    found = refusals(task)
    assert len(found) == 2 and "gpus = 2" in found[0] and "mcp_servers (1)" in found[1]
    assert all(line.startswith("task line-sums: task.toml [environment]") for line in found)
    assert refusals(task, provides=frozenset({"gpus", "mcp_servers"})) == []


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('workdir = "app"', "workdir 'app' must be an absolute path"),
        ("gpus = -1", "gpus = -1 is out of range"),
        ('gpus = "one"', "gpus = 'one' is not a number"),
        ('mcp_servers = "x"', "mcp_servers must be a list"),
    ],
)
def test_bad_new_fields_are_one_line(tmp_path: Path, extra: str, expected: str) -> None:
    task_dir = write_task(tmp_path)
    (task_dir / "task.toml").write_text((task_dir / "task.toml").read_text() + extra + "\n")
    with pytest.raises(UsageError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_task(str(task_dir))


def test_bad_env_tables_are_one_line(tmp_path: Path) -> None:
    task_dir = write_task(tmp_path)
    base = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(base + '[verifier.env]\n"1BAD" = "x"\n')
    with pytest.raises(UsageError, match="not a variable name"):
        load_task(str(task_dir))
    (task_dir / "task.toml").write_text(base + "[solution.env]\nX = [1]\n")
    with pytest.raises(UsageError, match=r"\[solution.env\] X must be a string"):
        load_task(str(task_dir))


def test_a_dataset_run_is_tasks_x_attempts_and_each_index_names_its_task(tmp_path: Path) -> None:
    from metrale.benchmarks.terminal_bench.benchmark import TerminalBenchBenchmark

    data = write_dataset(tmp_path)
    bench = TerminalBenchBenchmark()
    values = bench.configure({"task": str(data), "agent": "oracle", "attempts": 3})
    assert (values["rollouts"], values["attempts"]) == (9, 3)  # 3 runnable tasks x 3
    names = [bench.run_of(i).task.name for i in range(9)]
    assert names == ["build-fails"] * 3 + ["sums-right"] * 3 + ["sums-wrong"] * 3
    # past the run's count (serve's live sessions run as many as they like): the tasks in turn
    assert [bench.run_of(i).task.name for i in range(9, 12)] == ["build-fails"] * 3
    assert bench.run_of(12).task.name == "sums-right"
    with pytest.raises(UsageError, match="--rollouts 5: a dataset runs tasks x attempts"):
        TerminalBenchBenchmark().configure({"task": str(data), "rollouts": 5})
    one = TerminalBenchBenchmark()
    assert one.configure({"task": str(data / "sums-right"), "rollouts": 4})["attempts"] == 4
    with pytest.raises(UsageError, match="choose within a dataset"):
        TerminalBenchBenchmark().configure({"task": str(data / "sums-right"), "tasks": "x"})
    with pytest.raises(UsageError, match="gpus = 1"):  # one task asking for a GPU: refused
        TerminalBenchBenchmark().configure({"task": str(data / "wants-gpu")})


def test_builds_run_once_per_distinct_environment_and_at_most_n_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduling of `build_all` alone (the builds themselves are test_dataset_runs.py's):
    tasks with the same environment share one build, and its failure."""
    import asyncio

    from metrale.benchmarks.terminal_bench import prepare
    from metrale.benchmarks.terminal_bench.images import ImageBuildError
    from metrale.runtime.configs import DockerConfig

    data = tmp_path / "d"
    data.mkdir()
    for name in ("a1", "a2"):  # the same environment directory
        write_task(data, name)
    for i, name in enumerate(("b", "c", "d")):  # each its own
        write_task(data, name, dockerfile=f"FROM debian:bookworm\nRUN echo {i}\n")
    _, runs = prepare.task_runs({"task": str(data), "agent": "oracle", "max_turns": 1,
                                 "command_timeout_s": 1.0})  # fmt: skip
    built: list[str] = []
    in_flight, peak = 0, 0

    async def fake_build(run, values, config, log):  # type: ignore[no-untyped-def]
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        built.append(run.task.name)
        if run.task.name == "c":
            run.build_error = ImageBuildError("c fails")
        else:
            run.image = run.task.name  # a marker: which build this run got

    monkeypatch.setattr(prepare, "build", fake_build)
    values = {"task": str(data), "build_concurrency": 2}
    asyncio.run(prepare.build_all(runs, values, DockerConfig(), lambda *a: None))
    assert sorted(built) == ["a1", "b", "c", "d"] and peak == 2
    by_name = {r.task.name: r for r in runs}
    assert by_name["a2"].image == "a1"  # shared, not built again
    assert isinstance(by_name["c"].build_error, ImageBuildError) and by_name["c"].image is None
