"""The serve benchmark as a plugin: parameters, the plan of load levels, live snapshots, result.

It owns the wiring only: metric definitions are in `metrics`, load generation in `load`, the
HTTP path in `client`, prompts in `prompts`. The run directory gets `requests.jsonl` (every
request, flushed as it ends) and `levels.json` (each level's metrics, rewritten as each level
ends; `metrale plot` reads it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from metrale.benchmarks.serve.client import PreparedRequest, StreamClient
from metrale.benchmarks.serve.declared import METRICS, samples
from metrale.benchmarks.serve.load import (
    Bound,
    LevelSpec,
    LevelState,
    knee,
    run_level,
    sweep_rates,
)
from metrale.benchmarks.serve.metrics import (
    RequestRecord,
    summarize,
    tpot,
)
from metrale.benchmarks.serve.params import (
    LEVELS_FILE,
    REQUESTS_FILE,
    SWEEP_AXES,
    LevelSummary,
    ServeLevels,
    parse_percentiles,
    parse_slos,
    serve_parameters,
)
from metrale.benchmarks.serve.prompts import (
    Prompt,
    Tokenizer,
    gsm8k_questions,
    load_jsonl,
    synthetic,
)
from metrale.benchmarks.serve.table import levels_table, ms_text
from metrale.errors import UsageError
from metrale.fmt import number_text
from metrale.plugin import (
    BenchmarkResult,
    Descriptor,
    Metric,
    ParamSpec,
    PluginHandle,
    RunSummary,
    Status,
)
from metrale.plugin.lifecycle import BenchmarkBase
from metrale.stats import percentile


class ServeBenchmark(BenchmarkBase):
    #: serve never retries (a retry changes the load) and runs nothing in a sandbox
    options: ClassVar[frozenset[str]] = frozenset({"request_timeout", "stream", "max_response"})
    #: serve sends through its own lean client (`client.py`), not the chat client
    chat_client: ClassVar[bool] = False
    poll_s: ClassVar[float] = 0.5
    descriptor: ClassVar[Descriptor] = Descriptor(
        id="serve",
        name="Serve",
        summary="An endpoint under load: TTFT, TPOT, ITL, E2E, throughput and goodput at a "
        "fixed concurrency, a request rate, or a sweep that finds the knee.",
    )

    @staticmethod
    def run_curves(run_dir: Path) -> list[dict[str, Any]]:
        """`metrale report --html` on a serve run: latency against achieved throughput."""
        from metrale.benchmarks.serve.plot import serve_curves

        return serve_curves(run_dir)

    @staticmethod
    def plot_run(run_dir: Path, output: Path) -> Path:
        """`metrale plot DIR` on a serve run: latency against achieved throughput."""
        from metrale.benchmarks.serve.plot import plot_serve

        return plot_serve(run_dir, output)

    def __init__(self) -> None:
        super().__init__()
        self.slos: dict[str, float] = {}
        self.percentiles: list[float] = []
        self._file_prompts: list[Prompt] | None = None
        self._client: StreamClient | None = None
        self._bodies: list[PreparedRequest] = []
        self._state: LevelState | None = None
        self._levels = ServeLevels(load="concurrency")
        #: the measured records of each level, for the samples of the reported one
        self._records: dict[int, list[RequestRecord]] = {}
        self._t0 = 0.0
        self._next_prompt = 0
        self._ignore_eos = False

    def parameters(self) -> list[ParamSpec]:
        return serve_parameters()

    def sweep_axes(self) -> list[str]:
        return list(SWEEP_AXES)

    def metrics(self) -> list[Metric]:
        return list(METRICS)

    def calls_in_flight(self) -> int | None:
        """The level's concurrency; a sweep's saturating one; at a rate, its cap (or none)."""
        v = self.values
        if v["load"] == "concurrency":
            return int(v["concurrency"])
        if v["load"] == "sweep":
            return int(v["sweep_concurrency"])
        return None if v["max_concurrency"] is None else int(v["max_concurrency"])

    def configured(self) -> None:
        v = self.values
        self.slos = parse_slos(v["slo"])
        self.percentiles = parse_percentiles(v["percentiles"])
        if v["load"] == "rate" and v["rate"] is None:
            raise UsageError("load=rate needs --rate REQ_PER_S")
        if v["requests"] is None and v["duration_s"] is None:
            raise UsageError("give --requests N or --duration-s S (a level must stop)")
        if v["prompts"] not in ("synthetic", "gsm8k"):
            self._file_prompts = load_jsonl(Path(v["prompts"]))

    # ------------------------------------------------------------------------ load

    async def prepare(self, handle: PluginHandle) -> None:
        v = self.values
        assert handle.target is not None
        self._client = await StreamClient(
            handle.target, handle.client_options, v["api"]
        ).__aenter__()
        exact: bool | None = None
        if self._file_prompts is not None:
            prompts = self._file_prompts
        elif v["prompts"] == "gsm8k":
            prompts = gsm8k_questions()
        else:
            handle.on_status("prompts")
            tokenizer = Tokenizer(self._client.pool, handle.target)
            await tokenizer.detect()
            prompts, exact = await synthetic(
                v["num_prompts"], v["input_tokens"], v["seed"], tokenizer
            )
            if not exact:
                self._log("warn", "the server has no tokenize endpoint: synthetic prompt "
                          f"lengths are approximate ({v['input_tokens']} tokens taken as "
                          f"{round(v['input_tokens'] / 1.3)} words)")  # fmt: skip
        self._ignore_eos = v["ignore_eos"] and await self._accepts_ignore_eos()
        self._bodies = [self._body(p) for p in prompts]
        self._levels = ServeLevels(
            load=v["load"], slos=self.slos, percentiles=self.percentiles, input_tokens_exact=exact
        )

    def _body(self, prompt: Prompt, ignore_eos: bool | None = None) -> PreparedRequest:
        v = self.values
        body: dict[str, Any] = {
            "model": self.handle.target.model if self.handle and self.handle.target else "",
            "temperature": v["temperature"],
        }
        max_tokens = prompt.max_tokens or v["max_tokens"]
        if max_tokens is not None:  # none: no cap sent, the server's own limit applies
            body["max_tokens"] = max_tokens
        if v["api"] == "chat":
            body["messages"] = prompt.messages
        else:  # the messages' text, joined: /completions applies no chat template
            body["prompt"] = "\n".join(str(m.get("content", "")) for m in prompt.messages)
        if self._ignore_eos if ignore_eos is None else ignore_eos:
            body["ignore_eos"] = True
        assert self._client is not None
        return self._client.prepare(body)

    async def _accepts_ignore_eos(self) -> bool:
        """One short request with `ignore_eos`: a 4xx means the server refuses the field."""
        assert self._client is not None
        probe = RequestRecord(level=-1, index=-1, phase="warmup", intended_s=0.0, ready_s=0.0)
        # Not a measured prompt: a server with a prefix cache would serve that one warm.
        small = Prompt([{"role": "user", "content": "Say hi."}], 2)
        await self._client.send(self._body(small, ignore_eos=True), probe, time.perf_counter())
        if probe.status is not None and 400 <= probe.status < 500:
            self._log("warn", f"the server refused ignore_eos (HTTP {probe.status}); sent without")
            return False
        return True

    # ------------------------------------------------------------------------ run

    def _plan_fixed(self) -> LevelSpec:
        v = self.values
        if v["load"] == "concurrency":
            return self._spec(0, f"concurrency {v['concurrency']}", concurrency=v["concurrency"])
        return self._spec(0, f"rate {v['rate']:g}/s", rate=v["rate"])

    def _spec(self, index: int, label: str, **load: Any) -> LevelSpec:
        v = self.values
        return LevelSpec(
            index=index,
            label=label,
            arrivals=v["arrivals"],
            burstiness=v["burstiness"],
            max_concurrency=v["max_concurrency"] if "rate" in load else None,
            warmup=Bound(v["warmup"] or None, v["warmup_s"] or None),
            measure=Bound(v["requests"], v["duration_s"]),
            cooldown=Bound(v["cooldown"] or None, v["cooldown_s"] or None),
            max_error_rate=v["max_error_rate"],
            seed=v["seed"] + index,
            **load,
        )

    async def _run_all(self) -> None:
        v = self.values
        if v["load"] != "sweep":
            await self._run_level(self._plan_fixed())
            return
        low = await self._run_level(self._spec(0, "concurrency 1", concurrency=1))
        sat = await self._run_level(
            self._spec(1, f"saturation (concurrency {v['sweep_concurrency']})",
                       concurrency=v["sweep_concurrency"])
        )  # fmt: skip
        lo_rate = low.metrics.get("request_throughput") or 0.0
        hi_rate = sat.metrics.get("request_throughput") or 0.0
        if low.stopped or sat.stopped:
            return
        for i, rate in enumerate(sweep_rates(float(lo_rate), float(hi_rate), v["sweep_levels"])):
            level = await self._run_level(self._spec(2 + i, f"rate {rate:.3g}/s", rate=rate))
            if level.stopped:
                self._log("warn", f"sweep stopped at {level.label}: {level.stopped}")
                return

    async def _run_level(self, spec: LevelSpec) -> LevelSummary:
        assert self.handle is not None and self._client is not None
        handle, client = self.handle, self._client
        handle.on_status(spec.label)
        self._state = state = LevelState(spec)
        bodies = self._bodies

        async def send(record: RequestRecord) -> None:
            body = bodies[self._next_prompt % len(bodies)]
            self._next_prompt += 1
            await client.send(body, record, self._t0)

        def on_record(record: RequestRecord) -> None:
            handle.artifacts.append_line(REQUESTS_FILE, record)

        records = await run_level(spec, send, on_record, state, self._t0)
        self._records[spec.index] = [r for r in records if r.phase == "measure"]
        summary = LevelSummary(
            index=spec.index,
            label=spec.label,
            concurrency=spec.concurrency,
            rate=spec.rate,
            arrivals=spec.arrivals if spec.rate is not None else None,
            stopped=state.stopped,
            metrics=summarize(records, percentiles=self.percentiles, slos=self.slos),
        )
        self._levels.levels.append(summary)
        goodputs = [lv.metrics.get("goodput") for lv in self._levels.levels]
        self._levels.knee = knee([None if g is None else float(g) for g in goodputs])
        handle.artifacts.write_json(LEVELS_FILE, self._levels)
        if state.stopped:
            self._log("warn", f"{spec.label} stopped early: {state.stopped}")
        return summary

    async def run(self) -> None:
        self._t0 = self.work.started
        await self._run_all()

    def live(self) -> BenchmarkResult:
        state = self._state
        elapsed = self.work.elapsed_s
        result = BenchmarkResult(phase=state.spec.label if state else "start", elapsed_s=elapsed)
        if state is None:
            return result
        now = time.perf_counter()
        ok = [r for r in state.measured if r.ok]
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpots = [x for r in ok if (x := tpot(r)) is not None]
        errors = len(state.measured) - len(ok)
        result.done = len(state.measured)
        result.total = state.spec.measure.count
        result.summary = (
            f"{number_text(state.recent_rate(now))} req/s · in flight {state.in_flight} · "
            f"measured {len(state.measured)} · "
            f"TTFT p50/p90 {ms_text(ttft, 50)}/{ms_text(ttft, 90)} ms · "
            f"TPOT p50/p90 {ms_text(tpots, 50)}/{ms_text(tpots, 90)} ms · errors {errors}"
        )
        result.logs = list(self.logs)
        result.errors, result.level, result.in_flight = errors, state.spec.label, state.in_flight
        running = {"ttft": percentile(ttft, 50), "tpot": percentile(tpots, 50)}
        result.running_p50_s = {k: v for k, v in running.items() if v is not None}
        return result

    def final(self) -> BenchmarkResult:
        levels = self._levels.levels
        elapsed = self.work.elapsed_s
        metrics: dict[str, float | int | None] = {}
        k = self._levels.knee
        if len(levels) == 1:
            metrics.update(levels[0].metrics)
        else:
            for lv in levels:
                metrics.update({f"l{lv.index}.{key}": val for key, val in lv.metrics.items()})
            if k is not None:
                metrics.update(levels[k].metrics)
                metrics["knee_level"] = levels[k].index
            metrics["saturation_throughput"] = max(
                (float(lv.metrics.get("request_throughput") or 0.0) for lv in levels), default=None
            )
        exact = self._levels.input_tokens_exact
        metrics["input_tokens_exact"] = None if exact is None else int(exact)
        metrics["ignore_eos"] = int(self._ignore_eos)
        self._final_logs(levels)
        table = levels_table(levels, k, self.percentiles)
        head = levels[k] if k is not None else (levels[0] if levels else None)
        summary = "no level ran"
        if head is not None:
            m = head.metrics
            summary = (
                f"{len(levels)} level(s); {'knee ' if len(levels) > 1 else ''}{head.label}: "
                f"{number_text(m.get('request_throughput'))} req/s, "
                f"{number_text(m.get('output_throughput'))} tok/s, "
                f"goodput {number_text(m.get('goodput'))}"
            )
        return BenchmarkResult(
            status=Status.COMPLETED,
            phase="done",
            elapsed_s=elapsed,
            done=len(levels),
            total=len(levels),
            summary=summary,
            table=table,
            metrics=metrics,
            logs=list(self.logs),
            measured=self._summary(head, metrics, elapsed),
        )

    def _summary(
        self, head: LevelSummary | None, metrics: dict[str, float | int | None], elapsed: float
    ) -> RunSummary | None:
        """The run's summary: the reported level's requests (the knee of a sweep)."""
        if head is None:
            return None
        records = self._records.get(head.index, [])
        return RunSummary(
            declared=[m.declaration() for m in self.metrics()],
            unit="request",
            records=len(records),
            errors=sum(1 for r in records if not r.ok),
            e2e_s=elapsed,
            metrics=metrics,
            samples=dict(samples(records, self.slos)),  # typed as the field is (dict is invariant)
        )

    def _final_logs(self, levels: list[LevelSummary]) -> None:
        v = self.values
        if any(lv.metrics.get("tokens_counted") for lv in levels):
            self._log("warn", "the server sent no usage: output tokens are counted chunks")
        if self._ignore_eos and v["prompts"] == "synthetic" and v["max_tokens"] is not None:
            short = [
                lv.label
                for lv in levels
                if (lv.metrics.get("output_tokens_mean") or 0) < 0.95 * v["max_tokens"]
            ]
            if short:
                self._log("warn", "outputs shorter than max_tokens despite ignore_eos at: "
                          + ", ".join(short) + " (the server may not honour it)")  # fmt: skip
        for lv in levels:
            lag = lv.metrics.get("sched_lag_ms_p99", lv.metrics.get("sched_lag_ms_max"))
            if lag is not None and lag > 5.0:
                text = f"{lv.label}: client scheduling lag p99 {number_text(lag)} ms > 5 ms"
                self._log("warn", text + "; the client, not the server, may be limiting this level")
        if not self.slos and len(levels) > 1:
            self._log("info", "no --slo given: goodput equals throughput, the knee is saturation")

    def _log(self, level: Literal["info", "warn", "error"], message: str) -> None:
        self.log(message, level)

    async def teardown(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.__aexit__(None, None, None)
