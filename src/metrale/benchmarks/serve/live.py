"""The live session source: a rollout benchmark's own agent loop, driven as serve's lanes.

`--session-source live` runs real agents. A session is one real rollout of a benchmark whose
model rollouts run the shell agent loop (`RolloutBenchmark.agent_loop`: terminal_bench,
agentic_webserver), configured by `--live-params`: its once-per-run work (an image build, a
warm cache) done once in `load`, then per session a fresh sandbox, the agent's real commands
and the benchmark's own scoring, through the rollout layer's `run_rollout` (the stages, the
start limiter, and the sandbox stopped on every path, Ctrl-C included). The benchmark is found
by its entry point and driven through the contract and the rollout layer; serve never imports
it.

Each chat call of the loop is one turn of the session (`LiveChat`): sent through serve's
`StreamClient` (no retries: a retry would change the load), recorded as serve's `RequestRecord`
with the session id, the turn index (from 1), prompt and cached tokens, and the **tool time**
before it = this call's send-ready time − the previous turn's end: the agent's commands in the
sandbox and its own parsing, measured, not slept (0 before turn 1, whose wait is the sandbox's
start: the session record's setup stage). A failed call reaches the loop as the
`EndpointError` the chat client would raise: the agent ends (`exit_status` endpoint_error) and
the rollout is scored as it stands.

A session ends as a `SessionRecord` line in `sessions.jsonl`: its level, phase, id, task and
the rollout's own record (stages, reward, turns, metrics, typed error); the measured ones give
`session_reward_mean` and `session_error_rate` (`session_metrics.LIVE_METRICS`), and a level
whose sessions ran several tasks logs the reward per task (`session_metrics.live_by_task`).
Which task session k runs is the driven benchmark's choice for rollout k (terminal_bench's
dataset: task k mod n, its images built once per environment in `load`). Its
transcript is the benchmark's own (`transcripts/<rollout index>.jsonl`), the rollout index
numbering the run's sessions from 0 across levels.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel

from metrale.benchmarks.serve.lanes import Turns
from metrale.benchmarks.serve.metrics import Phase, RequestRecord
from metrale.endpoint.client import CallRecord, EndpointError, chat_body
from metrale.endpoint.stream import Completion
from metrale.errors import UsageError
from metrale.plugin import PluginHandle, benchmark_ids, canonical_id, get_benchmark
from metrale.rollout import RolloutBenchmark, RolloutPlan, RolloutRecord, run_rollout
from metrale.runtime.base import RuntimeConfig

SESSIONS_FILE = "sessions.jsonl"
#: Parameters of the driven benchmark that serve's lanes and sessions decide.
_LANES_DECIDE = ("rollouts", "max_concurrent", "iterations")

#: Sends one live turn's request body for `record`; what the response said, or None (failed).
LiveSend = Callable[[dict[str, Any], RequestRecord], Awaitable[Completion | None]]


class SessionRecord(BaseModel):
    """One live session: a line of `sessions.jsonl`, written as it ends."""

    level: int
    phase: Phase
    session: str
    #: the task the session ran, as its benchmark names it (`rollout.metrics.task`; None when
    #: the benchmark names none): a dataset's sessions run its tasks in turn
    task: str | None = None
    rollout: RolloutRecord

    @classmethod
    def of(cls, level: int, phase: Phase, session: str, rollout: RolloutRecord) -> SessionRecord:
        task = rollout.metrics.get("task")
        return cls(level=level, phase=phase, session=session, rollout=rollout,
                   task=task if isinstance(task, str) else None)  # fmt: skip


def parse_live_params(text: str) -> dict[str, str]:
    """`KEY=VALUE[,KEY=VALUE...]` -> parameters of the driven benchmark. A part with no `=`
    after a KEY=VALUE continues that value, so that a list parameter reads as the benchmark's
    own flag does: `tasks=fix-git,log-summary`."""
    out: dict[str, str] = {}
    last: str | None = None
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq and last is not None:
            out[last] += "," + part
            continue
        if not eq or not key:
            raise UsageError(
                f"live_params {part!r} is not KEY=VALUE; accepted: the driven benchmark's "
                "parameters, e.g. task=fix-git,max_turns=16"
            )
        if key in _LANES_DECIDE:
            raise UsageError(
                f"live_params {key}: serve's --lanes and --sessions decide the rollouts; "
                "accepted: the benchmark's other parameters"
            )
        out[key] = value.strip()
        last = key
    return out


def _agent_loop_ids() -> list[str]:
    found = []
    for name in benchmark_ids():
        cls = get_benchmark(name)
        if issubclass(cls, RolloutBenchmark) and cls.agent_loop:
            found.append(name)
    return found


class LiveChat:
    """The chat client a live session's agent loop is handed: each call is one turn, recorded
    through the lane's `Turns` (see the module docstring)."""

    def __init__(self, session: str, turns: Turns, send: LiveSend, model: str, t0: float) -> None:
        self.session, self.turns, self.send, self.model, self.t0 = session, turns, send, model, t0
        self.turn = 0
        #: the previous turn's end (perf_counter); None before the first
        self.last_end: float | None = None

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
        record_chunks: bool = False,
    ) -> CallRecord:
        ready = time.perf_counter()
        tool_s = 0.0 if self.last_end is None else max(ready - self.last_end, 0.0)
        self.turn += 1
        body = chat_body(
            self.model, messages, max_tokens=max_tokens, temperature=temperature, seed=seed,
            tools=tools, extra=extra,
        )  # fmt: skip
        answers: list[Completion | None] = []

        async def one(record: RequestRecord) -> None:
            answers.append(await self.send(body, record))

        record = await self.turns(self.session, self.turn, ready, tool_s, one)
        end = self.t0 + record.end_s if record.end_s is not None else time.perf_counter()
        self.last_end = end
        done = answers[0] if answers else None
        if done is None:
            kind, _, message = (record.error or "client: no answer").partition(": ")
            failed = CallRecord(
                started_at=record.started_at, status=record.status, error=record.error,
                error_kind=kind,
            )  # fmt: skip
            raise EndpointError(kind, message or kind, failed)
        return CallRecord.model_construct(
            started_at=record.started_at, retries=0, status=done.status, ttft_s=done.ttft_s,
            latency_s=done.e2e_s, prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens, token_source=done.token_source,
            finish_reason=done.finish_reason, content=done.content, reasoning=done.reasoning,
            tool_calls=done.tool_calls, chunk_times_s=done.chunk_times_s,
            connect_s=done.connect_s, error=None, error_kind=None,
        )  # fmt: skip


class LiveSource:
    """The driven benchmark: configured (every usage error now), loaded once, one rollout per
    session."""

    def __init__(self, benchmark: str, params: str) -> None:
        if canonical_id(benchmark) not in benchmark_ids():
            raise UsageError(
                f"--live-benchmark {benchmark}: no such benchmark; accepted: "
                f"{', '.join(_agent_loop_ids()) or '(none installed)'}"
            )
        cls = get_benchmark(benchmark)
        if not (issubclass(cls, RolloutBenchmark) and cls.agent_loop):
            raise UsageError(
                f"--live-benchmark {benchmark}: its rollouts run no agent loop to drive; "
                f"accepted: {', '.join(_agent_loop_ids()) or '(none installed)'}"
            )
        self.bench: RolloutBenchmark = cls()
        values = parse_live_params(params)
        try:
            self.bench.configure(values)
        except UsageError as exc:
            raise UsageError(f"--live-params ({cls.descriptor.id}): {exc}") from None
        if not self.bench.needs_model():
            raise UsageError(
                f"--session-source live drives {benchmark}'s agent calling the model; as "
                "configured it calls none (accepted: its model agent, e.g. agent=model)"
            )
        self.id = cls.descriptor.id
        self._plan: RolloutPlan | None = None
        self._numbers = itertools.count()

    def runtime_choice(self, runtime: RuntimeConfig | None) -> RuntimeConfig | None:
        return self.bench.runtime_choice(runtime)

    async def load(self, handle: PluginHandle) -> None:
        """The benchmark's once-per-run work, with the run's runtime and run directory (its
        own progress and resume are not serve's)."""
        own = dataclasses.replace(
            handle, on_progress=lambda done, total: None, resume=None, telemetry=None
        )
        await self.bench.load(own)
        self._plan = self.bench.plan()

    def new_session(self) -> tuple[int, str]:
        """The next rollout index and the session id it is known by."""
        index = next(self._numbers)
        return index, f"{self.id}-{index}"

    async def run(self, index: int, chat: LiveChat, origin: float) -> RolloutRecord:
        """One session: rollout `index` of the benchmark, its model calls through `chat`."""
        assert self._plan is not None, "LiveSource.run before load"
        record = await run_rollout(self._plan, index, origin, client=chat)
        self.bench.on_rollout(record)
        return record

    async def close(self) -> None:
        await self.bench.cleanup()
