"""GSM8K as a rollout benchmark: one grade-school math problem per rollout, exact-match reward.

setup: pick the problem (a seeded permutation of the 1,319 test problems; rollouts past 1,319
wrap around) and build the messages. generation: one chat call. scoring: extract the final
number and compare it with the reference; reward 1.0 on equality, else 0.0.

With a runtime (`--runtime`), scoring runs in the rollout's sandbox, as runtime comparisons do:
it runs awk with `grader.awk` (the same extraction rules in POSIX awk) as its program text and
the completion as the next argument, so no file is written per rollout (on a disk whose inode
allocator skips recently deleted inodes, each cost ~1–2.6 ms of CPU a rollout in the
512-sandbox cell; on a remote runtime, each is an upload). A completion that no argument can
hold (a NUL byte, or over `TEXT_ARG_MAX` bytes) is written to `completion.txt` and awk reads
that. A Python grader cost an interpreter start per rollout
(measured: ~30 ms wall and ~17 ms CPU each, so 512 rollouts spent ~9 s of CPU on 2 cores
scoring); awk costs ~1 ms. The awk grader declines (exit 3) the texts on which it could differ
from Python's Unicode-aware regexes (any non-ASCII byte, or a fraction beyond Decimal's 28
digits); those are graded by `python3 grader.py` (answer.py verbatim plus a main), written only
then. The record's `grader` metric says which one graded. Without a runtime, grading stays
in-process. Everything else (the standard parameters, the runtime, the client, the records,
the summary) is the rollout driver's.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

from metrale.benchmarks.gsm8k.answer import extract_answer, reference_answer
from metrale.datasets import gsm8k_test
from metrale.endpoint.client import CallRecord, EndpointError
from metrale.plugin import Descriptor, Metric, ParamSpec, max_tokens_param
from metrale.rollout import RolloutBenchmark, RolloutContext, RolloutRecord

DEFAULT_SYSTEM_PROMPT = (
    "Solve the math problem step by step. End with a line of the form '#### <number>'."
)


@dataclass(frozen=True)
class Problem:
    index: int
    question: str
    answer: str


def load_problems() -> list[Problem]:
    """The GSM8K test split (`metrale.datasets`), each with its reference number."""
    return [Problem(r.index, r.question, reference_answer(r.answer)) for r in gsm8k_test()]


GRADER_MAIN = """

if __name__ == "__main__":
    import json
    import sys

    with open(sys.argv[1], encoding="utf-8") as f:
        parsed = extract_answer(f.read())
    print(json.dumps({"parsed": parsed, "reward": 1.0 if parsed == sys.argv[2] else 0.0}))
"""


#: awk's exit when it leaves a text to grader.py (3), or when the sandbox has no awk (127)
AWK_DECLINED = (3, 127)
#: The longest completion given to awk as an argument (Linux takes 128 KiB an argument; a
#: remote runtime's exec request carries it too), in bytes.
TEXT_ARG_MAX = 64 << 10


def grader_awk() -> str:
    """The awk grader (`grader.awk`): `extract_answer` for ASCII texts, exit 3 otherwise."""
    return resources.files(__package__).joinpath("grader.awk").read_text(encoding="utf-8")


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

    async def generate(self, ctx: RolloutContext) -> None:
        values = self.bench.values
        assert ctx.client is not None
        seed = None if values["seed"] is None else values["seed"] + ctx.index
        try:
            call = await ctx.client.chat(
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
        runtime = ctx.runtime
        completion: str = ctx.state["completion"] or ""
        reference = self.problem.answer
        awk = ["awk", "-v", f"ref={reference}"]
        written = "\0" in completion or len(completion.encode()) > TEXT_ARG_MAX
        if written:
            await runtime.write("completion.txt", completion)
            awk += [self.bench.grader_awk, "completion.txt"]
        else:
            awk += ["-v", "text_arg=1", self.bench.grader_awk, completion]
        result = await runtime.run(awk, env={"LC_ALL": "C"}, timeout=60)
        ctx.record.metrics["grader"] = "awk"
        if result.exit_code in AWK_DECLINED and not result.stdout.strip():
            if not written:
                await runtime.write("completion.txt", completion)
            await runtime.write("grader.py", self.bench.grader)
            result = await runtime.run(
                ["python3", "grader.py", "completion.txt", reference], timeout=60
            )
            ctx.record.metrics["grader"] = "python"
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


def _parsed_none(r: RolloutRecord) -> float | None:
    if r.reward is None:
        return None
    return 1.0 if r.metrics.get("parsed") is None else 0.0


def _call_metric(key: str) -> Any:
    return lambda r: r.metrics.get(key) if r.error is None else None


class Gsm8kBenchmark(RolloutBenchmark):
    descriptor: ClassVar[Descriptor] = Descriptor(
        id="gsm8k",
        name="GSM8K",
        summary="Grade-school math word problems (test split, 1,319): one chat call per "
        "rollout, reward 1 when the final number matches.",
    )
    default_rollouts: ClassVar[int] = 64
    extra_axes: ClassVar[tuple[str, ...]] = ("max_tokens", "temperature", "seed", "system_prompt")

    def __init__(self) -> None:
        super().__init__()
        self._problems: list[Problem] = []
        self._order: list[int] = []
        self.grader = grader_script()
        self.grader_awk = grader_awk()

    def extra_parameters(self) -> list[ParamSpec]:
        return [
            max_tokens_param(256, "completion token cap per call"),
            ParamSpec(name="temperature", type="float", default=0.0, min=0.0, max=2.0,
                      help="sampling temperature"),
            ParamSpec(name="seed", type="int", default=0, min=0, nullable=True,
                      help="problem order and per-call seed (seed + index); none = unseeded"),
            ParamSpec(name="system_prompt", type="str", default=DEFAULT_SYSTEM_PROMPT,
                      help="system message; empty for none"),
        ]  # fmt: skip

    def task_metrics(self) -> list[Metric]:
        return [
            Metric("accuracy", "fraction", "higher", stat="mean",
                   value=lambda r: r.reward if r.reward is not None else 0.0,
                   doc="rollouts answered correctly / finished rollouts (a failed rollout "
                   "counts as wrong; `reward_mean` leaves it out)"),
            Metric("unparsed", "rollouts", "lower", stat="sum", value=_parsed_none,
                   doc="scored rollouts whose completion no extraction rule could parse"),
            Metric("ttft_s", "s", "lower", stat="p50", value=_call_metric("ttft_s"),
                   doc="p50 over successful calls of time to first token, from the send"),
            Metric("latency_s", "s", "lower", stat="p50", value=_call_metric("latency_s"),
                   doc="p50 over successful calls of send to last byte"),
            Metric("completion_tokens_per_rollout", "tokens", None, stat="mean",
                   value=lambda r: r.tokens.completion,
                   doc="mean completion tokens per call (server usage, or counted chunks)"),
        ]  # fmt: skip

    async def prepare(self, handle: Any) -> None:
        self._problems = load_problems()
        order = list(range(len(self._problems)))
        random.Random(self.values["seed"]).shuffle(order)
        self._order = order

    def make_task(self, index: int) -> _Gsm8kRollout:
        return _Gsm8kRollout(self, self._problems[self._order[index % len(self._order)]])
