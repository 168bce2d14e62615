"""GSM8K as a rollout benchmark: one grade-school math problem per rollout, exact-match reward.

setup: pick the problem (a seeded permutation of the 1,319 test problems; rollouts past 1,319
wrap around) and build the messages. generation: one chat call. scoring: extract the final
number and compare it with the reference; reward 1.0 on equality, else 0.0.

With a runtime (`--runtime`), setup also starts a sandbox and writes `grader.py` (this
package's answer extraction plus a main) into it, and scoring runs `python3 grader.py` there,
as runtime comparisons do; without one, grading stays in-process.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

from metrale.benchmarks.gsm8k.answer import extract_answer, reference_answer
from metrale.endpoint.client import CallRecord, ChatClient, EndpointError
from metrale.plugin import (
    BackgroundRun,
    BenchmarkResult,
    Descriptor,
    LogLine,
    ParamSpec,
    ParamValues,
    PluginHandle,
    Status,
    Table,
    validate_params,
)
from metrale.rollout import (
    SUMMARY_STAGES,
    Progress,
    RolloutContext,
    RolloutPlan,
    RolloutRecord,
    run_rollouts,
)
from metrale.runtime.configs import check_runtime, runtime_factory

DEFAULT_SYSTEM_PROMPT = (
    "Solve the math problem step by step. End with a line of the form '#### <number>'."
)


@dataclass(frozen=True)
class Problem:
    index: int
    question: str
    answer: str


def load_problems() -> list[Problem]:
    """The GSM8K test split shipped in this package (MIT licence, see data/LICENSE)."""
    text = resources.files(__package__).joinpath("data/test.jsonl").read_text(encoding="utf-8")
    problems = []
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            row = json.loads(line)
            problems.append(Problem(i, row["question"], reference_answer(row["answer"])))
    return problems


GRADER_MAIN = """

if __name__ == "__main__":
    import json
    import sys

    with open(sys.argv[1], encoding="utf-8") as f:
        parsed = extract_answer(f.read())
    print(json.dumps({"parsed": parsed, "reward": 1.0 if parsed == sys.argv[2] else 0.0}))
"""


def grader_script() -> str:
    """A standalone grader: the extraction rules of `answer.py`, verbatim, and a main."""
    source = resources.files(__package__).joinpath("answer.py").read_text(encoding="utf-8")
    return source + GRADER_MAIN


class GraderError(Exception):
    """The in-sandbox grader failed or printed no verdict (recorded on the rollout)."""

    kind = "grader"


class _Gsm8kRollout:
    def __init__(self, bench: Gsm8kBenchmark, problem: Problem) -> None:
        self.bench = bench
        self.problem = problem

    async def setup(self, ctx: RolloutContext) -> None:
        values = self.bench.values
        messages: list[dict[str, Any]] = []
        if values["system_prompt"]:
            messages.append({"role": "system", "content": values["system_prompt"]})
        messages.append({"role": "user", "content": self.problem.question})
        ctx.state["messages"] = messages
        ctx.record.metrics["problem"] = self.problem.index
        ctx.record.metrics["reference"] = self.problem.answer
        if ctx.runtime is not None:
            await ctx.runtime.write("grader.py", self.bench.grader)

    async def generate(self, ctx: RolloutContext) -> None:
        values = self.bench.values
        assert self.bench.client is not None
        seed = None if values["seed"] is None else values["seed"] + ctx.index
        try:
            call = await self.bench.client.chat(
                ctx.state["messages"],
                max_tokens=values["max_tokens"],
                temperature=values["temperature"],
                seed=seed,
            )
        except EndpointError as exc:
            if exc.call is not None:
                _record_call(ctx.record, exc.call)
            raise
        _record_call(ctx.record, call)
        ctx.state["completion"] = call.content

    async def score(self, ctx: RolloutContext) -> None:
        if ctx.runtime is None:
            parsed = extract_answer(ctx.state["completion"])
            ctx.record.metrics["parsed"] = parsed
            ctx.record.reward = 1.0 if parsed == self.problem.answer else 0.0
            return
        await ctx.runtime.write("completion.txt", ctx.state["completion"] or "")
        result = await ctx.runtime.run(
            ["python3", "grader.py", "completion.txt", self.problem.answer], timeout=60
        )
        try:
            verdict = json.loads(result.stdout.strip().splitlines()[-1])
            reward = float(verdict["reward"])
        except (IndexError, ValueError, KeyError, TypeError):
            why = result.stderr.strip()[-300:] or f"exit {result.exit_code}, no verdict"
            raise GraderError(f"grader failed: {why}") from None
        ctx.record.metrics["parsed"] = verdict.get("parsed")
        ctx.record.reward = reward


def _record_call(record: RolloutRecord, call: CallRecord) -> None:
    """The call's numbers onto the rollout's record; `retries` is set here, once, from the
    call (the rollout driver does not add a failed call's retries again)."""
    record.retries = call.retries
    record.tokens.prompt = call.prompt_tokens
    record.tokens.completion = call.completion_tokens
    record.tokens.source = call.token_source
    record.metrics["ttft_s"] = call.ttft_s
    record.metrics["latency_s"] = call.latency_s
    record.metrics["finish_reason"] = call.finish_reason


@dataclass
class _Gsm8kProgress(Progress):
    """The shared counters, and the one gsm8k adds: rewarded rollouts whose answer no rule
    could parse."""

    unparsed: int = 0

    def add(self, record: RolloutRecord) -> None:
        super().add(record)
        if record.reward is not None and record.metrics.get("parsed") is None:
            self.unparsed += 1


class Gsm8kBenchmark:
    #: `metrale run --resume` may finish one of its run directories (see `plugin.Resumable`)
    resumable: ClassVar[bool] = True
    descriptor: ClassVar[Descriptor] = Descriptor(
        id="gsm8k",
        name="GSM8K",
        summary="Grade-school math word problems (test split, 1,319): one chat call per "
        "rollout, reward 1 when the final number matches.",
    )

    def __init__(self) -> None:
        self.values = ParamValues()
        self.client: ChatClient | None = None
        self._handle: PluginHandle | None = None
        self._problems: list[Problem] = []
        self._progress = _Gsm8kProgress(keep_records=False)
        self._work = BackgroundRun()
        self._logs: list[LogLine] = []
        self.grader = grader_script()

    def parameters(self) -> list[ParamSpec]:
        return [
            ParamSpec(name="rollouts", type="int", default=64, min=1, max=1_000_000,
                      help="number of rollouts (problems wrap around past 1,319)"),
            ParamSpec(name="max_concurrent", type="int", default=None, min=1, nullable=True,
                      help="rollouts in flight at once; none = unbounded"),
            ParamSpec(name="max_tokens", type="int", default=256, min=1, max=1_000_000,
                      help="completion token cap per call"),
            ParamSpec(name="temperature", type="float", default=0.0, min=0.0, max=2.0,
                      help="sampling temperature"),
            ParamSpec(name="seed", type="int", default=0, min=0, nullable=True,
                      help="problem order and per-call seed (seed + index); none = unseeded"),
            ParamSpec(name="system_prompt", type="str", default=DEFAULT_SYSTEM_PROMPT,
                      help="system message; empty for none"),
        ]  # fmt: skip

    def configure(self, values: Mapping[str, object]) -> ParamValues:
        self.values = validate_params(self.parameters(), values)
        return self.values

    async def load(self, handle: PluginHandle) -> None:
        if handle.runtime is not None:
            # no sandbox here at all: a usage error, before work (probing may block: a thread)
            await asyncio.to_thread(check_runtime, handle.runtime)
        self._handle = handle
        if handle.resume is not None:
            for row in handle.resume.records():
                if row.get("index") in handle.resume.indices:
                    self._progress.add(RolloutRecord.model_validate(row))
        self._problems = load_problems()
        order = list(range(len(self._problems)))
        random.Random(self.values["seed"]).shuffle(order)
        self._order = order
        self.client = await ChatClient(handle.target, handle.client_options).__aenter__()

    def _plan(self) -> RolloutPlan:
        assert self._handle is not None
        handle = self._handle
        return RolloutPlan(
            benchmark=self.descriptor.id,
            count=self.values["rollouts"],
            max_concurrent=self.values["max_concurrent"],
            make_task=lambda i: _Gsm8kRollout(
                self, self._problems[self._order[i % len(self._order)]]
            ),
            on_record=handle.artifacts.append_record,
            run_id=handle.artifacts.run_dir.name,
            make_runtime=runtime_factory(handle.runtime) if handle.runtime else None,
            runtime_name=handle.runtime.type if handle.runtime else None,
            runtime_retries=handle.runtime_retries,
            skip=handle.resume.indices if handle.resume else frozenset(),
            on_warning=lambda message: self._logs.append(LogLine(level="warn", message=message)),
        )

    async def next(self) -> BenchmarkResult:
        if not self._work.started_yet:
            assert self._handle is not None
            self._handle.on_status("rollouts")
            self._work.start(run_rollouts(self._plan(), self._progress))
        if not await self._work.wait(0.25):
            return self._snapshot(Status.RUNNING)
        return self._snapshot(Status.COMPLETED, final=True)

    def _snapshot(self, status: Status, *, final: bool = False) -> BenchmarkResult:
        p = self._progress
        total = self.values["rollouts"]
        elapsed = self._work.elapsed_s
        result = BenchmarkResult(
            status=status,
            phase="rollouts" if status is Status.RUNNING else "done",
            elapsed_s=elapsed,
            done=p.done,
            total=total,
            summary=_progress_text(p, total),
            logs=list(self._logs),
        )
        if not final:
            return result
        result.stages = p.spreads()
        result.metrics = _metrics(p, elapsed)
        result.summary = (
            f"{p.done} rollouts, {result.metrics['errors']} errors, "
            f"accuracy {result.metrics['accuracy']:.3f}, e2e {elapsed:.2f} s"
        )
        result.table = Table(
            columns=["e2e", "err", "rew", *SUMMARY_STAGES],
            rows=[
                [
                    f"{elapsed:.2f}",
                    result.metrics["errors"],
                    _opt(result.metrics["reward_mean"]),
                    *(result.stages[s].cell() for s in SUMMARY_STAGES),
                ]
            ],
        )
        if p.error_kinds:
            self._logs.append(
                LogLine(
                    level="warn",
                    message="failed rollouts: "
                    + ", ".join(f"{k} x{v}" for k, v in sorted(p.error_kinds.items())),
                )
            )
        result.logs = list(self._logs)
        return result

    async def cleanup(self) -> None:
        await self._work.cancel()
        if self.client is not None:
            await self.client.__aexit__(None, None, None)
            self.client = None


def _opt(x: float | int | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _progress_text(p: Progress, total: int) -> str:
    reward = "-" if p.mean_reward is None else f"{p.mean_reward:.3f}"
    return f"{p.done}/{total} rollouts · {p.errors} errors · reward {reward}"


def _metrics(p: _Gsm8kProgress, elapsed: float) -> dict[str, float | int | None]:
    """Run-level numbers; `accuracy` counts failed rollouts as wrong, `reward_mean` skips them.
    A resumed run's numbers cover its earlier records too; `e2e_s` is this process's part."""
    completion = p.completion_tokens
    return {
        "rollouts": p.done,
        "errors": p.errors,
        "reward_mean": p.mean_reward,
        "accuracy": p.reward_sum / p.done if p.done else 0.0,
        "unparsed": p.unparsed,
        "retries": p.retries,
        "runtime_retries": p.runtime_retries,
        "e2e_s": elapsed,
        "prompt_tokens": p.prompt_tokens,
        "completion_tokens": completion,
        "completion_tokens_per_s": completion / elapsed if completion and elapsed > 0 else None,
        "tokens_counted": 1 if "counted" in p.token_sources else 0,
    }
