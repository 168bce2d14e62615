"""The runner's progress display off a terminal: lines when something changed, not per tick."""

import io

from metrale.live import PlainView as LiveProgress
from metrale.plugin import BenchmarkResult, LogLine, Status


def snap(summary: str, elapsed: float, status: Status = Status.RUNNING) -> BenchmarkResult:
    return BenchmarkResult(status=status, phase="rollouts", summary=summary, elapsed_s=elapsed)


def test_plain_lines_only_when_the_progress_changes() -> None:
    out = io.StringIO()
    display = LiveProgress(out, interval_s=0)
    display.phase("rollouts")
    display.snapshot(snap("2/8 rollouts", 2.0))
    display.snapshot(snap("2/8 rollouts", 4.0))  # only the clock moved: no line
    display.snapshot(snap("3/8 rollouts", 6.0))
    display.log(LogLine(level="warn", message="something"))
    display.snapshot(snap("8/8 rollouts", 8.0, Status.COMPLETED))
    display.close()
    assert out.getvalue().splitlines() == [
        "[rollouts]",
        "[rollouts] 2/8 rollouts  (2.0 s)",
        "[rollouts] 3/8 rollouts  (6.0 s)",
        "warning: something",
        "[rollouts] 8/8 rollouts  (8.0 s)",
    ]


def test_a_heartbeat_when_nothing_changes_for_long() -> None:
    out = io.StringIO()
    display = LiveProgress(out, interval_s=0)
    display.heartbeat_s = 0
    display.snapshot(snap("1/8 rollouts", 1.0))
    display.snapshot(snap("1/8 rollouts", 31.0))
    assert len(out.getvalue().splitlines()) == 2


def test_an_interrupted_run_tells_the_benchmark_before_cleanup(monkeypatch, tmp_path) -> None:
    import asyncio

    from metrale import runner
    from metrale.endpoint.client import Target
    from metrale.plugin import Descriptor, ParamValues, validate_params

    seen: dict[str, bool] = {}

    class Forever:
        descriptor = Descriptor(id="forever", name="Forever", summary="never ends")

        def parameters(self):
            return []

        def configure(self, values):
            return validate_params([], values)

        def runtime_choice(self, runtime):
            return runtime

        def metrics(self):
            return []

        def needs_model(self):
            return True

        async def load(self, handle):
            self.handle = handle

        async def next(self):
            await asyncio.sleep(3600)

        async def cleanup(self):
            seen["cancelled"] = self.handle.cancelled()

    monkeypatch.setattr(runner, "get_benchmark", lambda name: Forever)
    request = runner.RunRequest(
        benchmark="forever",
        params=ParamValues(),
        target=Target(base_url="http://127.0.0.1:9/v1", model="m"),
        out=tmp_path / "run",
        preflight=False,
        progress=None,
    )

    async def go() -> None:
        task = asyncio.create_task(runner.run(request))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    assert seen == {"cancelled": True}
    assert '"error": "interrupted"' in (tmp_path / "run" / "result.json").read_text()


def test_the_preflight_runs_beside_the_first_rollouts_and_is_recorded(tmp_path) -> None:
    """A target answering in 1 s: the 2+2 question no longer comes before the first rollout
    (it used to delay it by its whole answer), and run.json still gets its answer."""
    import asyncio
    import json
    import time

    from metrale.endpoint.client import Target
    from metrale.runner import RunRequest, run
    from tests.conftest import start_sim

    with start_sim("--ttft", "1.0", "--output-tokens", "4") as sim:
        started = time.time()
        request = RunRequest(
            benchmark="gsm8k", params={"rollouts": 2, "max_tokens": 4},
            target=Target(base_url=sim.url, model="metrale-sim"), out=tmp_path / "run",
            progress=None,
        )  # fmt: skip
        outcome = asyncio.run(run(request))
    assert outcome.exit_code == 0
    lines = (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()
    first = min(json.loads(line)["stages"]["generation"]["started_at"] for line in lines)
    assert first - started < 0.8  # with the preflight first: >= 1.0 s
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["preflight"] is not None and info["preflight"]["latency_s"] >= 1.0
