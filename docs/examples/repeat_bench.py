"""A worked example of a rollout benchmark: `repeat`, the one docs/extending.md walks through.

Each rollout asks the model to repeat one word and nothing else; the reward is 1 when the reply
is that word. With a runtime (`--runtime subprocess`, `bwrap`, ...), scoring runs `grep`
inside the rollout's sandbox, as a benchmark that grades model output with a program would.

The test suite registers this class under the `metrale.benchmarks` entry-point group and runs
it against `metrale sim` (tests/docs/test_examples.py), so what extending.md shows runs.
"""

from __future__ import annotations

from typing import ClassVar

from metrale.plugin import Descriptor, Metric, ParamSpec
from metrale.rollout import RolloutBenchmark, RolloutContext


class RepeatRollout:
    """One rollout's three stages; each reads and writes the rollout's context `ctx`."""

    def __init__(self, word: str, max_tokens: int) -> None:
        self.word = word
        self.max_tokens = max_tokens

    async def setup(self, ctx: RolloutContext) -> None:
        # setup: build the messages (the driver has already started ctx.runtime, if any)
        ctx.state["messages"] = [
            {"role": "user", "content": f"Repeat the word '{self.word}' and nothing else."}
        ]

    async def generate(self, ctx: RolloutContext) -> None:
        # generation: one chat call through the measuring client (TTFT, latency, tokens)
        assert ctx.client is not None
        call = await ctx.client.chat(ctx.state["messages"], max_tokens=self.max_tokens)
        ctx.record.tokens.completion = call.completion_tokens
        ctx.record.tokens.source = call.token_source
        ctx.record.metrics["ttft_s"] = call.ttft_s
        ctx.state["reply"] = (call.content or "").strip()
        # the value behind the `reply_words` metric (see "A metric" in extending.md)
        ctx.record.metrics["reply_words"] = len(ctx.state["reply"].split())

    async def score(self, ctx: RolloutContext) -> None:
        # scoring: in-process without a runtime, else inside the rollout's sandbox
        reply = ctx.state["reply"]
        if ctx.runtime is None:
            same = reply.lower() == self.word.lower()
        else:
            await ctx.runtime.write("reply.txt", reply + "\n")
            result = await ctx.runtime.run(["grep", "-qxiF", self.word, "reply.txt"], timeout=10)
            same = result.exit_code == 0
        ctx.record.reward = 1.0 if same else 0.0


class RepeatBenchmark(RolloutBenchmark):
    descriptor: ClassVar[Descriptor] = Descriptor(
        id="repeat",
        name="Repeat a word",
        summary="One chat call per rollout; reward 1 when the reply is the word asked for.",
    )
    default_rollouts: ClassVar[int] = 8
    # its own parameters that a sweep may vary, beside rollouts and max_concurrent
    extra_axes: ClassVar[tuple[str, ...]] = ("word",)

    def extra_parameters(self) -> list[ParamSpec]:
        return [
            ParamSpec(name="word", type="str", default="hello", help="the word to repeat"),
            ParamSpec(name="max_tokens", type="int", default=16, min=1, max=4096,
                      help="completion token cap per call"),
        ]  # fmt: skip

    def task_metrics(self) -> list[Metric]:
        return [
            Metric("ttft_s", "s", "lower", stat="p50",
                   value=lambda r: r.metrics.get("ttft_s") if r.error is None else None,
                   doc="p50 over successful calls of time to first token, from the send"),
            # "A metric": one declaration; its value comes from each rollout's record
            Metric("reply_words", "words", "lower", stat="mean",
                   value=lambda r: r.metrics.get("reply_words"), column=True,
                   doc="mean over rollouts of the words in the model's reply"),
        ]  # fmt: skip

    def make_task(self, index: int) -> RepeatRollout:
        return RepeatRollout(self.values["word"], self.values["max_tokens"])
