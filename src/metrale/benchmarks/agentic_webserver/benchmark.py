"""agentic_webserver: a model builds, tests, runs and tears down a Rust Axum server in a sandbox.

Phases: **load** (cargo must be there, else one clear line), **warm** (the shared cargo cache,
see `warm.py`), a log line saying that model-authored shell runs in the sandbox and where the
sandboxes are (the runner has probed the target and run the 2+2 preflight before load), then
`iterations` iterations one after another, each a rollout:

- setup: wipe and lay out `<run_dir>/sandboxes/<i>` (the warm target dir copied in), start the
  runtime with the sandbox bound in, pick a free port for `METRALE_HARNESS_PORT`.
- generation: the agent loop (`metrale.agent`) on the verbatim prompt (`prompt.txt`); its
  transcript goes to `<run_dir>/transcripts/<i>.jsonl`. **agent wall** ends here.
- scoring: stop the agent's runtime, score in a fresh one (`scorer.py`), check the six
  directions (`directions.py`). **iteration wall** = setup start to scoring end.

An iteration *fails* when the web server is not ok, a direction was missed, or it raised.
Sandboxes stay after the run as evidence (minus their copy of the cargo target dir, to bound
disk use); each is wiped when its index runs again in the same run directory.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from metrale.agent import Agent, AgentConfig, AgentStats
from metrale.benchmarks.agentic_webserver.directions import CHECKS, check_directions
from metrale.benchmarks.agentic_webserver.scorer import score
from metrale.benchmarks.agentic_webserver.warm import (
    Toolchain,
    WarmCache,
    find_toolchain,
    prepare_sandbox,
    warm,
)
from metrale.endpoint.client import ChatClient
from metrale.endpoint.local import free_port
from metrale.plugin import (
    BackgroundRun,
    BenchmarkResult,
    Check,
    Descriptor,
    LogLine,
    ParamSpec,
    ParamValues,
    PluginHandle,
    Status,
    Table,
    Verdict,
    validate_params,
)
from metrale.rollout import Progress, RolloutContext, RolloutPlan, RolloutRecord, run_rollouts
from metrale.runtime.base import Runtime, RuntimeConfig

RUNTIMES = ("bwrap", "subprocess")
#: Where the sandbox directory is bound inside bwrap (subprocess uses the host path).
BWRAP_SANDBOX = "/sandbox"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def task_prompt() -> str:
    """The task, verbatim from issue #4 (changing a word changes the benchmark)."""
    return resources.files(__package__).joinpath("prompt.txt").read_text(encoding="utf-8").strip()


class _Iteration:
    def __init__(self, bench: AgenticWebserverBenchmark, index: int) -> None:
        self.bench = bench
        self.index = index
        self.sandbox = bench.sandbox_root / str(index)
        self.inside = BWRAP_SANDBOX if bench.runtime_name == "bwrap" else str(self.sandbox)
        #: this iteration's `ctx.state`, kept here so the benchmark can read the agent after it
        self.state: dict[str, Any] = {}

    def make_runtime(self) -> Runtime:
        """The run's runtime config (`runtime` parameter, or the runner's, e.g. from a matrix
        cell, with its limits) plus this sandbox's binds: the toolchain and the cargo cache
        read-only at their host paths, the sandbox read-write at /sandbox."""
        from metrale.runtime.configs import Bind, BwrapConfig, create_runtime

        bench = self.bench
        assert bench.cache is not None and bench.toolchain is not None
        config = bench.runtime_config
        assert config is not None
        if isinstance(config, BwrapConfig):
            binds = [
                Bind(src=str(bench.toolchain.root)),
                Bind(src=str(bench.cache.home)),
                Bind(src=str(self.sandbox), dst=BWRAP_SANDBOX, writable=True),
            ]
            config = config.model_copy(update={"binds": [*config.binds, *binds]})
        return create_runtime(config)

    async def start_runtime(self, ctx: RolloutContext) -> Runtime:
        """Start a runtime as `ctx.runtime`, which the rollout stops whatever happens."""
        runtime = ctx.runtime = self.make_runtime()
        await runtime.start()
        return runtime

    def env(self, port: int) -> dict[str, str]:
        bench = self.bench
        assert bench.cache is not None and bench.toolchain is not None
        return {
            "PATH": f"{bench.toolchain.bin_dir}:{SANDBOX_PATH}",
            "CARGO_HOME": str(bench.cache.home),
            "CARGO_TARGET_DIR": f"{self.inside}/target",
            "CARGO_NET_OFFLINE": "true",
            "CARGO_TERM_COLOR": "never",
            "METRALE_HARNESS_PORT": str(port),
        }

    async def setup(self, ctx: RolloutContext) -> None:
        ctx.state = self.state
        assert self.bench.cache is not None
        await asyncio.to_thread(prepare_sandbox, self.bench.cache, self.sandbox)
        await self.start_runtime(ctx)
        ctx.state["port"] = free_port()
        ctx.record.metrics["sandbox"] = str(self.sandbox)

    async def generate(self, ctx: RolloutContext) -> None:
        bench = self.bench
        assert bench.client is not None and ctx.runtime is not None
        v = bench.values
        agent = Agent(
            bench.client,
            ctx.runtime,
            AgentConfig(
                max_turns=v["max_turns"],
                command_timeout_s=v["command_timeout_s"],
                max_tokens=v["max_tokens"],
            ),
            env=self.env(ctx.state["port"]),
            cwd=f"{self.inside}/work",
            transcript=bench.transcripts / f"{self.index}.jsonl",
        )
        ctx.state["agent"] = agent
        await agent.run(task_prompt())

    async def score(self, ctx: RolloutContext) -> None:
        v = self.bench.values
        agent: Agent = ctx.state["agent"]
        if ctx.runtime is not None:
            await ctx.runtime.stop()  # nothing the agent left running may answer for it
        runtime = await self.start_runtime(ctx)
        port = free_port()
        result = await score(
            runtime,
            workdir=f"{self.inside}/work",
            env=self.env(port),
            port=port,
            build_timeout_s=v["build_timeout_s"],
            serve_timeout_s=v["serve_timeout_s"],
        )
        directions = check_directions(agent.stats.commands)
        ctx.record.reward = 1.0 if result.webserver_ok and all(directions.values()) else 0.0
        ctx.record.metrics.update(
            webserver_ok=result.webserver_ok,
            score_note=result.note,
            build_s=result.build_s,
            serve_s=result.serve_s,
            directions=directions,
        )


def _fill_record(record: RolloutRecord, stats: AgentStats | None) -> None:
    if stats is None:
        return
    record.turns = stats.turns
    record.tokens.completion = stats.completion_tokens
    record.metrics.update(
        agent_wall_s=stats.wall_s,
        tool_calls=stats.tool_calls,
        hit_turn_cap=stats.hit_turn_cap,
        truncated_turns=stats.truncated_turns,
        unparsed_call_turns=stats.unparsed_call_turns,
        timed_out_commands=sum(1 for c in stats.commands if c.timed_out),
        exit_status=stats.exit_status,
        agent_error=stats.error,
    )


class AgenticWebserverBenchmark:
    descriptor: ClassVar[Descriptor] = Descriptor(
        id="agentic_webserver",
        name="Agentic web server",
        summary="A model builds, tests, runs and tears down a Rust Axum ping/pong server in a "
        "sandbox; scored by building and curling what it left, plus six directions checks.",
    )

    def __init__(self) -> None:
        self.values = ParamValues()
        self.client: ChatClient | None = None
        self.toolchain: Toolchain | None = None
        self.cache: WarmCache | None = None
        self.runtime_name = "bwrap"
        self.runtime_config: RuntimeConfig | None = None
        self.sandbox_root = Path("sandboxes")
        self.transcripts = Path("transcripts")
        self._handle: PluginHandle | None = None
        self._progress = Progress()
        self._work = BackgroundRun()
        self._logs: list[LogLine] = []
        self._rows: list[dict[str, Any]] = []
        self._tasks: dict[int, _Iteration] = {}

    def parameters(self) -> list[ParamSpec]:
        return [
            ParamSpec(name="iterations", type="int", default=1, min=1, max=1000,
                      help="iterations of the task, one after another, each in a fresh sandbox"),
            ParamSpec(name="max_turns", type="int", default=30, min=1, max=1000,
                      help="chat calls per iteration before the turn cap ends it"),
            ParamSpec(name="command_timeout_s", type="float", default=120.0, min=1,
                      help="seconds per agent command before it is killed"),
            ParamSpec(name="request_timeout_s", type="float", default=600.0, min=1,
                      help="seconds per chat request"),
            ParamSpec(name="build_timeout_s", type="float", default=300.0, min=1,
                      help="seconds for the scorer's cargo build"),
            ParamSpec(name="serve_timeout_s", type="float", default=30.0, min=1,
                      help="seconds for the built server to answer GET /ping with pong"),
            ParamSpec(name="max_tokens", type="int", default=4096, min=1, max=1_000_000,
                      help="completion token cap per chat call"),
            ParamSpec(name="wall_budget_s", type="float", default=None, min=0, nullable=True,
                      help="verdict: sum of iteration walls must be <= this; none = unbounded"),
            ParamSpec(name="s_per_turn_budget", type="float", default=None, min=0, nullable=True,
                      help="verdict: agent wall / turns must be <= this; none = unbounded"),
            ParamSpec(name="runtime", type="str", default="bwrap", choices=list(RUNTIMES),
                      help="where the agent's commands run (bwrap: network off)"),
        ]  # fmt: skip

    def configure(self, values: Mapping[str, object]) -> ParamValues:
        self.values = validate_params(self.parameters(), values)
        self.runtime_name = self.values["runtime"]
        return self.values

    async def load(self, handle: PluginHandle) -> None:
        from metrale.runtime.configs import check_runtime, parse_runtime_config, runtime_config

        self._handle = handle
        handle.on_status("load")
        self.toolchain = await asyncio.to_thread(find_toolchain)
        if handle.runtime is not None and handle.runtime.type in RUNTIMES:
            self.runtime_name = handle.runtime.type
            self.runtime_config = parse_runtime_config(handle.runtime.model_dump())
        else:
            if handle.runtime is not None:
                needs = " or ".join(RUNTIMES)
                self._log(f"runtime {handle.runtime.type} cannot host this benchmark (it needs "
                          f"{needs}); using {self.runtime_name}", "warn")  # fmt: skip
            self.runtime_config = runtime_config(self.runtime_name)
        await asyncio.to_thread(check_runtime, self.runtime_config)
        handle.on_status("warm")
        self.cache, warm_s, built = await warm(self.toolchain)
        self._log(
            f"warm: cargo cache {self.cache.root} "
            + (f"built in {warm_s:.1f} s" if built else "reused")
        )
        run_dir = handle.artifacts.run_dir
        self.sandbox_root = run_dir / "sandboxes"
        self.transcripts = run_dir / "transcripts"
        self.transcripts.mkdir(parents=True, exist_ok=True)
        where = (
            "bwrap sandbox (network off)"
            if self.runtime_name == "bwrap"
            else "subprocess runtime (no isolation)"
        )
        self._log(
            f"agentic_webserver executes model-authored shell commands in the {where}; "
            f"sandboxes: {self.sandbox_root}/<i> (kept as evidence, each wiped when its index "
            "runs again)"
        )
        options = handle.client_options.model_copy(
            update={"request_timeout_s": self.values["request_timeout_s"]}
        )
        self.client = await ChatClient(handle.target, options).__aenter__()

    def _log(self, message: str, level: str = "info") -> None:
        self._logs.append(LogLine(level=level, message=message))  # type: ignore[arg-type]

    def _plan(self) -> RolloutPlan:
        assert self._handle is not None
        handle = self._handle

        def on_record(record: RolloutRecord) -> None:
            self._on_record(record)
            handle.artifacts.append_record(record)
            handle.on_progress(self._progress.done, self.values["iterations"])

        return RolloutPlan(
            benchmark=self.descriptor.id,
            count=self.values["iterations"],
            max_concurrent=1,
            make_task=self._make_task,
            runtime_name=self.runtime_name,
            on_record=on_record,
            run_id=handle.artifacts.run_dir.name,
        )

    def _make_task(self, index: int) -> _Iteration:
        task = _Iteration(self, index)
        self._tasks[index] = task
        return task

    def _on_record(self, record: RolloutRecord) -> None:
        """Fill in the agent's numbers, note what went wrong, log the run's line."""
        task = self._tasks.get(record.index)
        state = task.state if task is not None else {}
        agent: Agent | None = state.get("agent")
        _fill_record(record, agent.stats if agent else None)
        directions: dict[str, bool] = record.metrics.get("directions") or dict.fromkeys(
            CHECKS, False
        )
        ok = bool(record.metrics.get("webserver_ok"))
        notes: list[str] = []
        if record.error is not None:
            notes.append(f"{record.error.stage} error: {record.error.type}: {record.error.message}")
        if record.metrics.get("score_note"):
            notes.append(record.metrics["score_note"])
        if agent is not None and agent.stats.hit_turn_cap:
            notes.append(f"hit the turn cap ({self.values['max_turns']})")
        if agent is not None and agent.stats.error:
            notes.append(f"agent stopped: {agent.stats.error}")
        timeouts = record.metrics.get("timed_out_commands") or 0
        if timeouts:
            notes.append(f"{timeouts} command(s) timed out")
        if record.metrics.get("unparsed_call_turns"):
            notes.append(f"{record.metrics['unparsed_call_turns']} unparsed call turn(s)")
        if record.metrics.get("truncated_turns"):
            notes.append(f"{record.metrics['truncated_turns']} truncated turn(s)")
        missed = [name for name, passed in directions.items() if not passed]
        if missed:
            notes.append("missed: " + ", ".join(missed))
        note = "; ".join(notes)
        wall = record.total_s or 0.0
        setup = record.stages.get("setup")
        agent_wall = agent.stats.wall_s if agent else 0.0
        row = {
            "index": record.index,
            "webserver_ok": ok,
            "steps": sum(directions.values()),
            "directions": directions,
            "wall_s": wall,
            "agent_wall_s": agent_wall,
            "setup_s": setup.duration_s if setup else None,
            "turns": agent.stats.turns if agent else 0,
            "tool_calls": agent.stats.tool_calls if agent else 0,
            "completion_tokens": agent.stats.completion_tokens if agent else 0,
            "hit_turn_cap": bool(agent and agent.stats.hit_turn_cap),
            "truncated_turns": agent.stats.truncated_turns if agent else 0,
            "unparsed_call_turns": agent.stats.unparsed_call_turns if agent else 0,
            "failed": not (ok and not missed and record.error is None),
            "note": note,
        }
        record.metrics["note"] = note
        self._rows.append(row)
        self._log(
            f"run {record.index}: {'webserver_ok' if ok else 'FAILED'} · {row['steps']}/6 steps"
            f" · {wall:.1f} s · {row['turns']} turns" + (f" · {note}" if note else "")
        )
        if task is not None:
            self._drop_target_copy(task)

    @staticmethod
    def _drop_target_copy(task: _Iteration) -> None:
        shutil.rmtree(task.sandbox / "target", ignore_errors=True)

    async def next(self) -> BenchmarkResult:
        if not self._work.started_yet:
            assert self._handle is not None
            self._handle.on_status("iterations")
            self._work.start(run_rollouts(self._plan(), self._progress))
        if not await self._work.wait(0.25):
            return self._snapshot(Status.RUNNING)
        return self._snapshot(Status.COMPLETED, final=True)

    def _snapshot(self, status: Status, *, final: bool = False) -> BenchmarkResult:
        total = self.values["iterations"]
        elapsed = self._work.elapsed_s
        rows = sorted(self._rows, key=lambda r: r["index"])
        ok = sum(1 for r in rows if r["webserver_ok"])
        result = BenchmarkResult(
            status=status,
            phase="iterations" if status is Status.RUNNING else "done",
            elapsed_s=elapsed,
            done=len(rows),
            total=total,
            summary=f"{len(rows)}/{total} iterations · {ok} webserver_ok",
            logs=list(self._logs),
        )
        if not final:
            return result
        if not rows:
            result.status = Status.FAILED
            result.error = "No iterations ran"
            return result
        result.metrics = iteration_metrics(rows)
        m = result.metrics
        result.summary = (
            f"{m['iterations']} iterations · {m['webserver_ok']} webserver_ok · "
            f"{m['followed_directions']} followed directions · "
            f"s/turn {_fmt(m['s_per_turn'])} · decode {_fmt(m['decode_tps'])} tok/s"
        )
        result.table = Table(
            columns=["run", "webserver", "steps", "wall_s", "agent_s", "turns", "calls",
                     "tokens", "note"],
            rows=[
                [r["index"], "ok" if r["webserver_ok"] else "FAILED", f"{r['steps']}/6",
                 f"{r['wall_s']:.1f}", f"{r['agent_wall_s']:.1f}", r["turns"], r["tool_calls"],
                 r["completion_tokens"], r["note"]]
                for r in rows
            ],
        )  # fmt: skip
        result.verdict = verdict(rows, m, self.values)
        return result

    async def cleanup(self) -> None:
        await self._work.cancel()
        if self.client is not None:
            await self.client.__aexit__(None, None, None)
            self.client = None


def _fmt(x: float | int | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def iteration_metrics(rows: list[dict[str, Any]]) -> dict[str, float | int | None]:
    """Run-level numbers over the iteration rows.

    - `s_per_turn` = sum of agent wall / sum of turns (None, i.e. absent, when no turn was
      taken); agent wall ends before scoring.
    - `decode_tps` = sum of completion tokens / sum of agent wall (None when no agent time):
      tokens the agent loop received per second of its wall time, commands included.
    - `steps_<check>` = iterations that passed each directions check.
    """
    turns = sum(r["turns"] for r in rows)
    agent_wall = sum(r["agent_wall_s"] for r in rows)
    tokens = sum(r["completion_tokens"] for r in rows)
    metrics: dict[str, float | int | None] = {
        "iterations": len(rows),
        "webserver_ok": sum(1 for r in rows if r["webserver_ok"]),
        "followed_directions": sum(1 for r in rows if r["steps"] == len(CHECKS)),
        "failed_iterations": sum(1 for r in rows if r["failed"]),
        "sum_wall_s": sum(r["wall_s"] for r in rows),
        "sum_agent_wall_s": agent_wall,
        "sum_turns": turns,
        "sum_tool_calls": sum(r["tool_calls"] for r in rows),
        "sum_completion_tokens": tokens,
        "s_per_turn": agent_wall / turns if turns else None,
        "decode_tps": tokens / agent_wall if agent_wall > 0 else None,
    }
    for name in CHECKS:
        metrics[f"steps_{name}"] = sum(1 for r in rows if r["directions"].get(name))
    metrics.update(
        sum_hit_turn_cap=sum(1 for r in rows if r["hit_turn_cap"]),
        sum_truncated_turns=sum(r["truncated_turns"] for r in rows),
        sum_unparsed_call_turns=sum(r["unparsed_call_turns"] for r in rows),
        max_iter_turns=max(r["turns"] for r in rows) if rows else None,
    )
    return metrics


def verdict(
    rows: list[dict[str, Any]], metrics: Mapping[str, Any], values: Mapping[str, Any]
) -> Verdict:
    """Fails on any failed iteration (naming each), on `sum_wall_s > wall_budget_s`, and on
    `s_per_turn > s_per_turn_budget` (an absent s_per_turn does not meet a budget)."""
    failed = [r for r in rows if r["failed"]]
    checks = [
        Check(
            metric="failed_iterations",
            op="<=",
            limit=0,
            value=len(failed),
            passed=not failed,
            reason="; ".join(f"run {r['index']}: {r['note'] or 'failed'}" for r in failed),
        )
    ]
    if values.get("wall_budget_s") is not None:
        value = metrics["sum_wall_s"]
        checks.append(Check(metric="sum_wall_s", op="<=", limit=values["wall_budget_s"],
                            value=value, passed=value <= values["wall_budget_s"]))  # fmt: skip
    if values.get("s_per_turn_budget") is not None:
        value = metrics["s_per_turn"]
        limit = values["s_per_turn_budget"]
        reason = "" if value is not None else "absent: no turn taken"
        passed = value is not None and value <= limit
        checks.append(Check(metric="s_per_turn", op="<=", limit=limit, value=value,
                            passed=passed, reason=reason))  # fmt: skip
    return Verdict(checks=checks)
