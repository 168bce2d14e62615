"""A rollout's record and context: what is written per rollout, and what its stages share.

A rollout record is one JSON line in `rollouts.jsonl`, appended as the rollout ends (see
`pool`). Its stage timings come from `time.perf_counter()`; each also keeps its wall-clock start.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from metrale.runtime.base import Runtime

if TYPE_CHECKING:
    from metrale.endpoint.client import ChatModel


class Stage(StrEnum):
    SETUP = "setup"
    GENERATION = "generation"
    SCORING = "scoring"


STAGES: tuple[Stage, ...] = (Stage.SETUP, Stage.GENERATION, Stage.SCORING)


class StageTiming(BaseModel):
    started_at: float = Field(description="wall-clock start, epoch seconds")
    start_s: float = Field(description="monotonic start, seconds since the run began")
    end_s: float
    duration_s: float


class Tokens(BaseModel):
    prompt: int | None = None
    completion: int | None = None
    source: str | None = Field(default=None, description="'usage' (server) or 'counted'")


class ErrorInfo(BaseModel):
    type: str
    message: str
    stage: str | None = None


class RolloutRecord(BaseModel):
    id: str
    benchmark: str
    index: int
    runtime: str | None = None
    started_at: float
    stages: dict[str, StageTiming] = Field(default_factory=dict)
    total_s: float | None = None
    #: seconds of setup spent queued for a sandbox start slot (included in setup; None: the
    #: rollout started no sandbox); restarts add theirs
    setup_wait_s: float | None = None
    #: seconds its sandbox's stop() took (after the last stage; not in total)
    stop_s: float | None = None
    #: seconds the warm pool's start of its sandbox took, ahead of it (`--runtime-pool`; not
    #: in setup, which holds only what the rollout still waited for it)
    pool_start_s: float | None = None
    reward: float | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    tokens: Tokens = Field(default_factory=Tokens)
    turns: int | None = None
    retries: int = 0
    runtime_retries: int = 0
    error: ErrorInfo | None = None


class RolloutTask(Protocol):
    """A benchmark's three stages for one rollout; each may read and write `ctx`.

    Two optional methods: `async before_runtime(ctx)`, timed in setup, runs before the
    rollout's runtime starts (lay out what the runtime binds); `async teardown(ctx)` runs after
    the runtime has stopped, on every path (drop what the rollout no longer needs), untimed.
    """

    async def setup(self, ctx: RolloutContext) -> None: ...

    async def generate(self, ctx: RolloutContext) -> None: ...

    async def score(self, ctx: RolloutContext) -> None: ...


@dataclass
class RolloutContext:
    """What one rollout's stages share. `runtime` is the rollout's started sandbox (None for
    in-process rollouts); `client` the run's chat client (None when no model is called);
    `state` is the task's own. `restart_runtime()` stops the sandbox and starts a fresh one
    (same config, retries and start rate), e.g. to score in a sandbox the agent never touched;
    the driver stops whichever is current when the rollout ends."""

    index: int
    record: RolloutRecord
    runtime: Runtime | None = None
    client: ChatModel | None = None
    run_dir: Path | None = None
    state: dict[str, Any] = field(default_factory=dict)
    _restart: Callable[[RolloutContext], Awaitable[Runtime]] | None = field(
        default=None, repr=False
    )

    async def restart_runtime(self) -> Runtime:
        if self._restart is None:
            raise RuntimeError("this rollout has no runtime to restart")
        return await self._restart(self)
