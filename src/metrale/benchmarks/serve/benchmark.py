"""The serve benchmark as a plugin: parameters, the plan of load levels, live snapshots, result.

It owns the wiring only: metric definitions are in `metrics`, load generation in `load`, the
HTTP path in `client`, prompts in `prompts`. The run directory gets `requests.jsonl` (every
request, flushed as it ends) and `levels.json` (each level's metrics, rewritten as each level
ends; `metrale plot` reads it).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from metrale.agent import BASH_TOOL
from metrale.benchmarks.serve.client import Launch, PreparedRequest, StreamClient
from metrale.benchmarks.serve.declared import METRICS, samples
from metrale.benchmarks.serve.lanes import Turns, run_lanes, run_session_lanes
from metrale.benchmarks.serve.live import SESSIONS_FILE, LiveChat, LiveSource, SessionRecord
from metrale.benchmarks.serve.load import (
    Bound,
    LevelSpec,
    LevelState,
    knee,
    run_level,
    sweep_rates,
)
from metrale.benchmarks.serve.metrics import (
    Phase,
    RequestRecord,
    summarize,
    tpot,
    with_server_rate,
)
from metrale.benchmarks.serve.params import (
    LEVELS_FILE,
    REQUESTS_FILE,
    SWEEP_AXES,
    LevelSummary,
    ServeLevels,
    parse_percentiles,
    serve_parameters,
)
from metrale.benchmarks.serve.prompts import (
    Prompt,
    Tokenizer,
    gsm8k_questions,
    load_jsonl,
    synthetic,
)
from metrale.benchmarks.serve.search import (
    LOAD_OF_AXIS,
    Measured,
    SearchSpec,
    capacity_search,
    parse_search,
)
from metrale.benchmarks.serve.session_metrics import (
    Outcome,
    by_turn,
    live_by_task,
    live_samples,
    session_samples,
    summarize_live,
    summarize_sessions,
)
from metrale.benchmarks.serve.sessions import Session, SessionSource, Turn, session_source
from metrale.benchmarks.serve.slo import (
    OverSaturation,
    Tier,
    bootstrap_criteria,
    evaluate,
    parse_slo,
)
from metrale.benchmarks.serve.table import levels_table, ms_text
from metrale.benchmarks.serve.trace import TraceRequest, load_trace, trace_prompts
from metrale.benchmarks.serve.workers import parse_workers, run_level_in_workers
from metrale.endpoint.stream import Completion
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
from metrale.prefix import IdealPrefixCache, block_hashes, message_words
from metrale.stats import percentile

if TYPE_CHECKING:
    from metrale.runtime.base import RuntimeConfig

#: Client lag (arrival to processed) above which a level's chunk times may be the client's:
#: chunks are stamped on arrival, so only a client a whole chunk interval behind (tens of ms
#: at a batching server's decode step) stamps late; 10 ms is well before that.
CLIENT_LAG_WARN_MS = 10.0
#: the live view's running TTFT and TPOT are those of the latest this many measured requests
LIVE_WINDOW = 512


class ServeBenchmark(BenchmarkBase):
    #: serve never retries (a retry changes the load) and runs nothing in a sandbox, except
    #: live sessions' agents: that configuration honours the runtime flags too (`configured`)
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
        self.client_workers = 1
        self._live_state: LevelState | None = None
        self._live_seen = self._live_errors = 0
        self.percentiles: list[float] = []
        self._file_prompts: list[Prompt] | None = None
        self._sessions: SessionSource | None = None
        self._live: LiveSource | None = None
        #: each level's measured live sessions: (reward, ended in an error, task)
        self._outcomes: dict[int, list[Outcome]] = {}
        self.tiers: list[Tier] = []
        self._search: SearchSpec | None = None
        self._trace: list[TraceRequest] | None = None
        self._client: StreamClient | None = None
        self._bodies: list[PreparedRequest] = []
        self._state: LevelState | None = None
        self._levels = ServeLevels(load="concurrency")
        #: the measured records of each level, for the samples of the reported one
        self._records: dict[int, list[RequestRecord]] = {}
        self._t0 = 0.0
        self._next_prompt = 0
        self._ignore_eos = False
        #: each body's prompt as prefix-cache blocks and its token count (`metrale.prefix`)
        self._prefixes: list[tuple[list[bytes], int]] = []
        self._ideal = IdealPrefixCache()

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
        self.slos, self.tiers = parse_slo(v["slo"], METRICS)
        self.client_workers = parse_workers(v["client_workers"])
        if v["search"] != "none":
            self._search = self._search_spec()
        self.percentiles = parse_percentiles(v["percentiles"])
        if v["load"] == "rate" and v["rate"] is None:
            raise UsageError("load=rate needs --rate REQ_PER_S")
        if v["session_source"] != "live" and (
            v["live_params"] or v["live_benchmark"] != "terminal_bench"
        ):
            raise UsageError("--live-benchmark and --live-params shape --session-source live "
                             f"only; the session source is {v['session_source']!r}")  # fmt: skip
        if v["load"] == "sessions":
            self._sessions = self._session_source()
        elif v["session_source"] == "live":
            raise UsageError("--session-source live is a session workload: give --load sessions")
        elif v["requests"] is None and v["duration_s"] is None:
            raise UsageError("give --requests N or --duration-s S (a level must stop)")
        elif v["prompts"] not in ("synthetic", "gsm8k"):
            self._file_prompts = load_jsonl(Path(v["prompts"]))
        if v["trace"]:
            if v["load"] != "concurrency" or v["prompts"] != "synthetic":
                raise UsageError("--trace replays its own arrivals and prompts; it takes no "
                                 "--load rate/sweep nor --prompts")  # fmt: skip
            if v["shared_prefix_tokens"]:
                raise UsageError("--trace shares the blocks its hash_ids say; it takes no "
                                 "--shared-prefix-tokens")  # fmt: skip
            self._trace = load_trace(Path(v["trace"]))
        if v["shared_prefix_tokens"] and v["prompts"] != "synthetic":
            raise UsageError("--shared-prefix-tokens shapes synthetic prompts only; "
                             f"--prompts is {v['prompts']!r}")  # fmt: skip

    def _session_source(self) -> SessionSource | None:
        v = self.values
        if v["sessions"] is None and v["duration_s"] is None:
            raise UsageError("give --sessions N or --duration-s S (a level must stop)")
        if v["api"] != "chat":
            raise UsageError("load=sessions sends chat messages: it needs --api chat")
        if v["session_source"] == "live":
            self._live = LiveSource(v["live_benchmark"], v["live_params"])
            # this configuration's own options (the CLI reads the configured instance's):
            # setattr, since the class's are a ClassVar
            setattr(self, "options", type(self).options | {"runtime"})  # noqa: B010
            return None
        return session_source(v)

    def runtime_choice(self, runtime: RuntimeConfig | None) -> RuntimeConfig | None:
        """Live sessions' agents run in the driven benchmark's runtime (its default and its
        refusals); every other workload runs nothing in a sandbox."""
        if self._live is not None:
            return self._live.runtime_choice(runtime)
        if runtime is not None:
            raise UsageError(
                "--runtime does not apply to serve: it runs nothing in a sandbox "
                "unless --load sessions --session-source live (accepted: no --runtime)"
            )
        return None

    def _search_spec(self) -> SearchSpec:
        v = self.values
        axis, load = v["search"], LOAD_OF_AXIS[v["search"]]
        if v["load"] != load:
            raise UsageError(f"--search {axis} varies load={load}: give --load {load}")
        if not self.tiers:
            raise UsageError("--search needs at least one SLO tier in --slo "
                             "(e.g. --slo 'ttft_p95<=2s,session_goodput>=0.95')")  # fmt: skip
        return parse_search(axis, v["search_range"], v["search_step"])

    # ------------------------------------------------------------------------ load

    async def prepare(self, handle: PluginHandle) -> None:
        v = self.values
        assert handle.target is not None
        self._client = await StreamClient(
            handle.target, handle.client_options, v["api"]
        ).__aenter__()
        exact: bool | None = None
        if self._sessions is not None:
            prompts = []
        elif self._file_prompts is not None:
            prompts = self._file_prompts
        elif v["prompts"] == "gsm8k":
            prompts = gsm8k_questions()
        elif self._trace is not None:
            handle.on_status("prompts")
            tokenizer = Tokenizer(self._client.pool, handle.target)
            exact = await tokenizer.detect()
            prompts = await trace_prompts(self._trace, tokenizer)
            if not exact:
                self._log("warn", "the server has no tokenize endpoint: trace prompt lengths "
                          "are approximate (1.3 tokens a word)")  # fmt: skip
        else:
            handle.on_status("prompts")
            tokenizer = Tokenizer(self._client.pool, handle.target)
            await tokenizer.detect()
            prompts, exact = await synthetic(
                v["num_prompts"], v["input_tokens"], v["seed"], tokenizer,
                v["shared_prefix_tokens"],
            )  # fmt: skip
            if not exact:
                self._log("warn", "the server has no tokenize endpoint: synthetic prompt "
                          f"lengths are approximate ({v['input_tokens']} tokens taken as "
                          f"{round(v['input_tokens'] / 1.3)} words)")  # fmt: skip
        # live agents' calls are the agent's own (no ignore_eos): nothing to probe for them
        self._ignore_eos = (
            v["ignore_eos"] and self._live is None and await self._accepts_ignore_eos()
        )
        if self._live is not None:  # its image, its cache: once, before any level
            handle.on_status(f"live: {self._live.id}")
            await self._live.load(handle)
            for line in self._live.bench.logs:  # its build and where its commands run
                self._log(line.level, f"{self._live.id}: {line.message}")
        self._bodies = [self._body(p) for p in prompts]
        self._ideal = IdealPrefixCache(v["cache_block"])
        self._prefixes = [
            (block_hashes(words, v["cache_block"]), len(words))
            for words in (message_words(p.messages) for p in prompts)
        ]
        load = "trace" if self._trace is not None else v["load"]
        self._levels = ServeLevels(
            load=load, slos=self.slos, percentiles=self.percentiles, input_tokens_exact=exact,
            tiers={t.name: t.text for t in self.tiers},
        )  # fmt: skip

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
            body["prompt"] = "\n".join(str(m.get("content") or "") for m in prompt.messages)
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

    def _turn_body(self, session: Session, turn: Turn) -> PreparedRequest:
        """One turn's request: the session's messages up to the turn, with its tools; encoded
        from the session alone, so a replay sends the same bytes."""
        v = self.values
        body: dict[str, Any] = {
            "model": self.handle.target.model if self.handle and self.handle.target else "",
            "max_tokens": turn.max_tokens or v["max_tokens"],
            "temperature": v["temperature"],
            "messages": session.messages[: turn.upto],
            "tools": session.tools or [BASH_TOOL],
        }
        if self._ignore_eos:
            body["ignore_eos"] = True
        assert self._client is not None
        return self._client.prepare(body)

    def _plan_fixed(self) -> LevelSpec:
        v = self.values
        if v["load"] == "sessions":
            return self._spec(0, f"lanes {v['lanes']}", lanes=v["lanes"])
        if self._trace is not None:
            speed = v["trace_speed"]
            return LevelSpec(
                index=0, label=f"trace x{speed:g}", arrivals="constant",
                measure=Bound(len(self._trace)), max_error_rate=v["max_error_rate"],
                offsets_s=tuple(r.offset_s / speed for r in self._trace),
            )  # fmt: skip
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
            measure=Bound(v["sessions"] if "lanes" in load else v["requests"], v["duration_s"]),
            cooldown=Bound(v["cooldown"] or None, v["cooldown_s"] or None),
            max_error_rate=v["max_error_rate"],
            seed=v["seed"] + index,
            ramp_s=v["ramp_s"] if "lanes" in load else 0.0,
            **load,
        )

    async def _run_search(self, spec: SearchSpec) -> None:
        v = self.values
        planned = v["requests"] if spec.axis != "lanes" else None
        if spec.axis == "lanes" and v["session_source"] == "synthetic" and v["sessions"]:
            planned = v["sessions"] * v["turns"]

        async def measure(load: float) -> Measured:
            index = len(self._levels.levels)
            value: float | int = load if spec.axis == "rate" else int(load)
            level = self._spec(index, f"{spec.axis} {value:g}", **{spec.axis: value})
            stop = OverSaturation(self.tiers, self.slos, planned, v["sessions"])
            summary = await self._run_level(level, stop)
            return Measured(index, summary.tiers, summary.metrics)

        def bootstrap(tier: Tier, index: int) -> dict[str, list[float]]:
            return bootstrap_criteria(tier, self._records[index], self.slos, seed=v["seed"])

        result = await capacity_search(spec, self.tiers, measure, bootstrap)
        self._levels.search = result
        assert self.handle is not None
        self.handle.artifacts.write_json(LEVELS_FILE, self._levels)
        for b in result.tiers:
            where = "below LOW" if b.boundary is None else f"{b.boundary:g}"
            above = "none (HIGH passed)" if b.above is None else f"{b.above:g} fails"
            self._log("info", f"capacity ({b.tier}: {b.criteria}): {spec.axis} {where}; "
                      f"{number_text(b.request_throughput)} req/s, goodput "
                      f"{number_text(b.goodput)}, session goodput "
                      f"{number_text(b.session_goodput)}; next level {above}")  # fmt: skip

    async def _run_all(self) -> None:
        v = self.values
        if self._search is not None:
            await self._run_search(self._search)
            return
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

    async def _run_level(
        self, spec: LevelSpec, early_stop: OverSaturation | None = None
    ) -> LevelSummary:
        assert self.handle is not None and self._client is not None
        handle, client = self.handle, self._client
        handle.on_status(spec.label)
        self._state = state = LevelState(spec)
        bodies = self._bodies

        def prepare(record: RequestRecord) -> Launch:
            i = self._next_prompt % len(bodies)
            self._next_prompt += 1
            names, tokens = self._prefixes[i]
            record.ideal_prompt_tokens = tokens
            record.ideal_cached_tokens = self._ideal.add_blocks(names, tokens)
            return client.launch(bodies[i], record, self._t0)

        async def send(record: RequestRecord) -> None:
            await prepare(record).finish()

        def on_record(record: RequestRecord) -> None:
            handle.artifacts.append_line(REQUESTS_FILE, record)

        def prepare_turn(session: Session, turn: Turn) -> Callable[[RequestRecord], Launch]:
            words = message_words(session.messages[: turn.upto])
            names, tokens = block_hashes(words, self._ideal.block), len(words)
            request = self._turn_body(session, turn)

            def due(record: RequestRecord) -> Launch:  # the ideal cache counts in send order
                record.ideal_prompt_tokens = tokens
                record.ideal_cached_tokens = self._ideal.add_blocks(names, tokens)
                return client.launch(request, record, self._t0)

            return due

        async def send_turn(session: Session, turn: Turn, record: RequestRecord) -> None:
            await prepare_turn(session, turn)(record).finish()

        started = time.perf_counter()
        if spec.lanes is not None and self._live is not None:
            drive = self._live_drive(spec.index)
            records = await run_session_lanes(spec, drive, on_record, state, self._t0, early_stop)
        elif spec.lanes is not None:
            assert self._sessions is not None
            records = await run_lanes(
                spec, self._sessions, send_turn, on_record, state, self._t0, early_stop,
                prepare_turn,
            )  # fmt: skip
        elif self.client_workers > 1 and spec.concurrency is not None and spec.concurrency > 1:
            assert handle.target is not None
            records = await run_level_in_workers(
                spec, self.client_workers, handle.target, handle.client_options,
                self.values["api"], bodies, self._t0, state, on_record,
            )  # fmt: skip
        else:
            if spec.concurrency is not None or not spec.warmup.empty:
                # A fixed concurrency (or a warm-up) opens the level's connections before it
                # starts, so that its first wave is writes only and no measured request pays a
                # connect (a connect is reported apart anyway: `connect_ms_*`).
                await client.pool.open(spec.concurrency or spec.max_concurrency or 0)
            records = await run_level(spec, send, on_record, state, self._t0, early_stop, prepare)
        self._records[spec.index] = [r for r in records if r.phase == "measure"]
        metrics = summarize(records, percentiles=self.percentiles, slos=self.slos)
        if spec.lanes is not None:
            metrics.update(summarize_sessions(records, self.slos))
        if self._live is not None:
            metrics.update(summarize_live(self._outcomes.get(spec.index, [])))
            per_task = live_by_task(self._outcomes.get(spec.index, []))
            if per_task is not None:  # a dataset's tasks, each its own reward
                self._log("info", f"{spec.label}: {per_task}")
        if handle.telemetry is not None:
            window = handle.telemetry.summary(started, time.perf_counter())
            metrics.update(with_server_rate(metrics, window))
        summary = LevelSummary(
            index=spec.index,
            label=spec.label,
            concurrency=spec.concurrency,
            rate=spec.rate,
            lanes=spec.lanes,
            arrivals=spec.arrivals if spec.rate is not None else None,
            stopped=state.stopped,
            metrics=metrics,
            tiers={t.name: evaluate(t, records, self.slos, metrics) for t in self.tiers},
            by_turn=by_turn(records) if spec.lanes is not None else {},
        )
        self._levels.levels.append(summary)
        goodputs = [lv.metrics.get("goodput") for lv in self._levels.levels]
        self._levels.knee = knee([None if g is None else float(g) for g in goodputs])
        handle.artifacts.write_json(LEVELS_FILE, self._levels)
        if state.stopped:
            self._log("warn", f"{spec.label} stopped early: {state.stopped}")
        return summary

    def _live_drive(self, level: int) -> Callable[[int, Phase, Turns], Awaitable[None]]:
        """One live session per call: a real rollout whose chat calls are this level's turns."""
        assert self.handle is not None and self._client is not None and self._live is not None
        handle, client, live = self.handle, self._client, self._live
        model = handle.target.model if handle.target is not None else ""
        outcomes = self._outcomes.setdefault(level, [])

        async def send(body: dict[str, Any], record: RequestRecord) -> Completion | None:
            words = message_words(body["messages"])
            record.ideal_prompt_tokens = len(words)
            record.ideal_cached_tokens = self._ideal.add(words)
            return await client.send(client.prepare(body), record, self._t0, keep_text=True)

        async def drive(_k: int, phase: Phase, turns: Turns) -> None:
            index, session = live.new_session()
            chat = LiveChat(session, turns, send, model, self._t0)
            rollout = await live.run(index, chat, self._t0)
            line = SessionRecord.of(level, phase, session, rollout)
            handle.artifacts.append_line(SESSIONS_FILE, line)
            if phase == "measure":
                outcomes.append((rollout.reward, rollout.error is not None, line.task))

        return drive

    def in_flight(self) -> int | None:
        """Requests in flight now: the load beside the server's telemetry (`telemetry.jsonl`)."""
        return self._state.in_flight if self._state is not None else None

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
        # The running figures are those of the latest LIVE_WINDOW requests, and the error count
        # is kept as records come: this runs every `poll_s` on the loop that sends, so its cost
        # must not grow with the run (over 6,000 records it took ~10 ms, every scheduling lag
        # behind it that much later).
        measured = state.measured
        if self._live_state is not state:  # a new level
            self._live_state, self._live_seen, self._live_errors = state, 0, 0
        for r in measured[self._live_seen :]:
            self._live_errors += r.error is not None
        self._live_seen = len(measured)
        ok = [r for r in measured[-LIVE_WINDOW:] if r.ok]
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpots = [x for r in ok if (x := tpot(r)) is not None]
        errors = self._live_errors
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
        search = self._levels.search
        if search is not None and search.tiers:  # the reported level: the first tier's boundary
            metrics["capacity"] = search.tiers[0].boundary
            metrics.update({f"capacity.{b.tier}": b.boundary for b in search.tiers})
            at = next((lv for lv in levels if _load_of(lv) == search.tiers[0].boundary), None)
            k = at.index if at is not None else None
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
        mark = "capacity" if search is not None else "knee"
        table = levels_table(levels, k, self.percentiles, mark)
        head = levels[k] if k is not None else (levels[0] if levels else None)
        summary = "no level ran"
        if head is not None:
            m = head.metrics
            summary = (
                f"{len(levels)} level(s); {mark + ' ' if len(levels) > 1 else ''}{head.label}: "
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
            # typed as the field is (dict is invariant)
            samples={
                **samples(records, self.slos),
                **session_samples(records, self.slos),
                **live_samples(self._outcomes.get(head.index, [])),
            },
        )

    def _final_logs(self, levels: list[LevelSummary]) -> None:
        v = self.values
        if any(lv.metrics.get("tokens_counted") for lv in levels):
            self._log("warn", "the server sent no usage: output tokens are counted chunks")
        live = self._live is not None  # the agent's own max_tokens; no ignore_eos sent
        if (
            self._ignore_eos
            and v["prompts"] == "synthetic"
            and v["max_tokens"] is not None
            and not live
        ):
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
            client = lv.metrics.get("client_lag_ms_p99")
            if client is not None and client > CLIENT_LAG_WARN_MS:
                self._log("warn", f"{lv.label}: client lag p99 {number_text(client)} ms > "
                          f"{CLIENT_LAG_WARN_MS:g} ms: the client fell behind the streams, so "
                          "chunk times may be the client's, not the server's (--client-workers "
                          "spreads the load over processes)")  # fmt: skip
        if not self.slos and not self.tiers and len(levels) > 1:
            self._log("info", "no --slo given: goodput equals throughput, the knee is saturation")

    def _log(self, level: Literal["info", "warn", "error"], message: str) -> None:
        self.log(message, level)

    async def teardown(self) -> None:
        if self._live is not None:  # its sandboxes were stopped with their sessions
            await self._live.close()
        if self._client is not None:
            client, self._client = self._client, None
            await client.__aexit__(None, None, None)


def _load_of(level: LevelSummary) -> float | None:
    load = next((x for x in (level.lanes, level.concurrency, level.rate) if x is not None), None)
    return None if load is None else float(load)
