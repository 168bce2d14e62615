"""agentic_webserver: a model builds, tests, runs and tears down a Rust Axum server in a sandbox.

A rollout benchmark on the one engine (`metrale.rollout.RolloutBenchmark`): `--rollouts N
--max-concurrent K` runs K agents at once (`iterations` is an alias of `rollouts`; default 1),
each in its own fresh sandbox with its own `METRALE_HARNESS_PORT`, all sharing the read-only warm
cargo cache (`warm.py`, built once in `prepare`, before the rollouts).

- **setup**: lay out `<run_dir>/sandboxes/<i>` (the warm target dir copied in), start the
  sandbox (bwrap by default, or subprocess) with it bound at /sandbox, pick a port.
- **generation**: the agent loop (`metrale.agent`) on the verbatim prompt (`prompt.txt`); its
  transcript goes to `<run_dir>/transcripts/<i>.jsonl`.
- **scoring**: the agent's sandbox is stopped (nothing it left running may answer for it), a
  fresh one builds, runs and curls what it left (`scorer.py`), and the six directions are
  checked on its commands (`directions.py`).

**reward** = 1.0 when the server answered and all six directions were followed, else 0.0, so
`reward_mean` is the pass rate. Sandboxes stay after the run as evidence, minus their copy of the
cargo target dir; each is wiped when its index runs again in the same run directory.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from metrale.agent import Agent, AgentConfig, AgentStats
from metrale.benchmarks.agentic_webserver.directions import check_directions
from metrale.benchmarks.agentic_webserver.metrics import METRICS, rollout_note, verdict
from metrale.benchmarks.agentic_webserver.scorer import score
from metrale.benchmarks.agentic_webserver.warm import (
    Toolchain,
    WarmCache,
    find_toolchain,
    prepare_sandbox,
    warm,
)
from metrale.errors import UsageError
from metrale.fmt import duration_text, number_text
from metrale.net import free_port
from metrale.plugin import (
    Descriptor,
    Metric,
    ParamSpec,
    ParamValues,
    PluginHandle,
    RunSummary,
    Table,
    Verdict,
    max_tokens_param,
)
from metrale.rollout import RolloutBenchmark, RolloutContext, RolloutRecord
from metrale.runtime.base import Capability, RuntimeConfig

#: Where the sandbox directory is bound inside bwrap (subprocess uses the host path).
BWRAP_SANDBOX = "/sandbox"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def task_prompt() -> str:
    """The task, verbatim from issue #4 (changing a word changes the benchmark)."""
    return resources.files(__package__).joinpath("prompt.txt").read_text(encoding="utf-8").strip()


class _Rollout:
    def __init__(self, bench: AgenticWebserverBenchmark, index: int) -> None:
        self.bench = bench
        self.index = index
        self.sandbox = bench.sandbox_dir(index)
        self.inside = bench.inside(self.sandbox)
        self.port = 0
        self.ports: list[int] = []

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

    async def before_runtime(self, ctx: RolloutContext) -> None:
        assert self.bench.cache is not None
        await asyncio.to_thread(prepare_sandbox, self.bench.cache, self.sandbox)
        ctx.record.metrics["sandbox"] = str(self.sandbox)

    async def setup(self, ctx: RolloutContext) -> None:
        self.port = self.take_port()

    def take_port(self) -> int:
        """A free port no other rollout of this run holds (they share the host's ports under
        the subprocess runtime)."""
        port = free_port(avoid=self.bench.ports)
        self.ports.append(port)
        return port

    async def generate(self, ctx: RolloutContext) -> None:
        bench = self.bench
        assert ctx.client is not None and ctx.runtime is not None
        v = bench.values
        agent = Agent(
            ctx.client,
            ctx.runtime,
            AgentConfig(
                max_turns=v["max_turns"],
                command_timeout_s=v["command_timeout_s"],
                max_tokens=v["max_tokens"],
            ),
            env=self.env(self.port),
            cwd=f"{self.inside}/work",
            transcript=bench.transcripts / f"{self.index}.jsonl",
        )
        ctx.state["agent"] = agent
        try:
            await agent.run(task_prompt())
        finally:
            _fill_record(ctx.record, agent.stats)

    async def score(self, ctx: RolloutContext) -> None:
        v = self.bench.values
        agent: Agent = ctx.state["agent"]
        runtime = await ctx.restart_runtime()
        port = self.take_port()
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

    async def teardown(self, ctx: RolloutContext) -> None:
        self.bench.ports.difference_update(self.ports)
        await asyncio.to_thread(shutil.rmtree, self.sandbox / "target", True)


def _fill_record(record: RolloutRecord, stats: AgentStats | None) -> None:
    if stats is None:
        return
    record.turns = stats.turns
    record.tokens.completion = stats.completion_tokens
    record.metrics.update(stats.record_metrics())


class AgenticWebserverBenchmark(RolloutBenchmark):
    descriptor: ClassVar[Descriptor] = Descriptor(
        id="agentic_webserver",
        name="Agentic web server",
        summary="A model builds, tests, runs and tears down a Rust Axum ping/pong server in a "
        "sandbox; scored by building and curling what it left, plus six directions checks.",
    )
    default_rollouts: ClassVar[int] = 1
    max_rollouts: ClassVar[int] = 1000
    needs: ClassVar[frozenset[Capability]] = frozenset({Capability.HOST_PATHS})
    warm_pool: ClassVar[bool] = False  # each sandbox dir is filled before its start
    default_runtime: ClassVar[str | None] = "bwrap"
    runtime_reason: ClassVar[str] = (
        "the agent builds with this machine's cargo toolchain and warm cache, bound into a "
        "bwrap sandbox or used in place by subprocess"
    )
    keep_records: ClassVar[bool] = True
    agent_loop: ClassVar[bool] = True
    extra_axes: ClassVar[tuple[str, ...]] = ("max_turns", "max_tokens", "command_timeout_s")

    def __init__(self) -> None:
        super().__init__()
        self.toolchain: Toolchain | None = None
        self.cache: WarmCache | None = None
        self.runtime: RuntimeConfig | None = None
        self.sandbox_root = Path("sandboxes")
        self.transcripts = Path("transcripts")
        #: ports handed to rollouts in flight (see `_Rollout.take_port`)
        self.ports: set[int] = set()

    def extra_parameters(self) -> list[ParamSpec]:
        return [
            ParamSpec(name="iterations", type="int", default=None, min=1, max=1000,
                      nullable=True, help="alias of rollouts"),
            ParamSpec(name="max_turns", type="int", default=30, min=1, max=1000,
                      help="chat calls per rollout before the turn cap ends it"),
            ParamSpec(name="command_timeout_s", type="float", default=120.0, min=1,
                      help="seconds per agent command before it is killed"),
            ParamSpec(name="build_timeout_s", type="float", default=300.0, min=1,
                      help="seconds for the scorer's cargo build"),
            ParamSpec(name="serve_timeout_s", type="float", default=30.0, min=1,
                      help="seconds for the built server to answer GET /ping with pong"),
            max_tokens_param(4096, "completion token cap per chat call"),
            ParamSpec(name="wall_budget_s", type="float", default=None, min=0, nullable=True,
                      help="verdict: sum of rollout totals must be <= this; none = unbounded"),
            ParamSpec(name="s_per_turn_budget", type="float", default=None, min=0, nullable=True,
                      help="verdict: agent wall / turns must be <= this; none = unbounded"),
        ]  # fmt: skip

    def configure(self, values: Mapping[str, object]) -> ParamValues:
        raw = dict(values)
        if raw.get("iterations") is not None:
            alias = raw.pop("iterations")
            if "rollouts" in raw and str(raw["rollouts"]) != str(alias):
                raise UsageError(
                    f"iterations={alias} and rollouts={raw['rollouts']} disagree; "
                    "iterations is an alias of rollouts: give one"
                )
            raw["rollouts"] = alias
        super().configure(raw)
        self.values["iterations"] = self.values["rollouts"]
        return self.values

    def task_metrics(self) -> list[Metric]:
        return list(METRICS)

    def sandbox_dir(self, index: int) -> Path:
        return self.sandbox_root / str(index)

    async def prepare(self, handle: PluginHandle) -> None:
        assert handle.runtime is not None, "runtime_choice always gives this benchmark one"
        self.runtime = handle.runtime
        self.toolchain = await asyncio.to_thread(find_toolchain)
        handle.on_status("warm")
        self.cache, warm_s, built = await warm(self.toolchain)
        self.log(
            f"warm: cargo cache {self.cache.root} "
            + (f"built in {warm_s:.1f} s" if built else "reused")
        )
        run_dir = handle.artifacts.run_dir
        self.sandbox_root = run_dir / "sandboxes"
        self.transcripts = run_dir / "transcripts"
        self.transcripts.mkdir(parents=True, exist_ok=True)
        where = (
            f"{self.runtime.type} sandbox (network off)"
            if Capability.NETWORK_OFF in self.runtime.capabilities
            else f"{self.runtime.type} runtime (no isolation)"
        )
        self.log(
            f"agentic_webserver executes model-authored shell commands in the {where}; "
            f"sandboxes: {self.sandbox_root}/<i> (kept as evidence, each wiped when its index "
            "runs again)"
        )

    def inside(self, sandbox: Path) -> str:
        """Where rollout's sandbox dir is inside its sandbox: /sandbox where the runtime can
        show it there (bwrap), its host path where commands run on the host (subprocess)."""
        assert self.runtime is not None
        return self.runtime.with_paths((), {str(sandbox): BWRAP_SANDBOX})[1][str(sandbox)]

    def runtime_for(self, config: RuntimeConfig, index: int) -> RuntimeConfig:
        """The run's runtime config plus this rollout's paths: the toolchain and the cargo
        cache read-only at their host paths, the sandbox read-write (at /sandbox in bwrap)."""
        assert self.cache is not None and self.toolchain is not None
        sandbox = str(self.sandbox_dir(index))
        read_only = (str(self.toolchain.root), str(self.cache.home))
        return config.with_paths(read_only, {sandbox: BWRAP_SANDBOX})[0]

    def make_task(self, index: int) -> _Rollout:
        return _Rollout(self, index)

    def on_rollout(self, record: RolloutRecord) -> None:
        note = rollout_note(record, self.values["max_turns"])
        record.metrics["note"] = note
        ok = bool(record.metrics.get("webserver_ok"))
        steps = sum((record.metrics.get("directions") or {}).values())
        self.log(
            f"run {record.index}: {'webserver_ok' if ok else 'FAILED'} · {steps}/6 steps"
            f" · {duration_text(record.total_s)} · {record.turns or 0} turns"
            + (f" · {note}" if note else "")
        )

    def summary_text(self, summary: RunSummary) -> str:
        m = summary.metrics
        return (
            f"{summary.records} rollouts · {m.get('webserver_ok')} webserver_ok · "
            f"{m.get('followed_directions')} followed directions · "
            f"s/turn {number_text(m.get('s_per_turn'))} · "
            f"decode {number_text(m.get('decode_tps'))} tok/s · "
            f"e2e {duration_text(summary.e2e_s)}"
        )

    def table(self, summary: RunSummary, stages: Any) -> Table:
        """One row per rollout: what an agentic run is read by."""
        rows = []
        for r in sorted(self.progress.records, key=lambda r: r.index):
            directions = r.metrics.get("directions") or {}
            rows.append([
                r.index, "ok" if r.metrics.get("webserver_ok") else "FAILED",
                f"{sum(directions.values())}/6", number_text(r.total_s),
                number_text(r.metrics.get("agent_wall_s")), r.turns or 0,
                r.metrics.get("tool_calls") or 0, r.tokens.completion or 0,
                r.metrics.get("note", ""),
            ])  # fmt: skip
        return Table(
            columns=["run", "webserver", "steps", "wall_s", "agent_s", "turns", "calls",
                     "tokens", "note"],
            rows=rows,
        )  # fmt: skip

    def verdict(self, summary: RunSummary) -> Verdict:
        return verdict(self.progress.records, summary.metrics, self.values)
