"""The `rollout` layer: the engine under every rollout benchmark.

- `records`: a rollout's record and the context its stages share;
- `pool`: run N rollouts under a concurrency bound, clock their stages, record each one
  (`run_rollout`: one, for a caller that schedules rollouts itself);
- `limiter`: how many sandbox starts may be under way at once; `warm`: the warm pool of
  sandboxes started ahead (`--runtime-pool`); `fds`: the file-descriptor bound on concurrency;
- `BenchmarkBase`, the load / next / cleanup shape every benchmark shares, is the contract's
  (`metrale.plugin.lifecycle`), re-exported here;
- `driver`: `RolloutBenchmark`, what a rollout benchmark subclasses;
- `summary`: the standard metrics and the run's one summary;
- `teardown`: `finish`, the await that completes a stop whatever cancels it.
"""

from metrale.plugin.lifecycle import BackgroundRun, BenchmarkBase
from metrale.plugin.results import SUMMARY_STAGES, shown_stages
from metrale.rollout.driver import RolloutBenchmark, bound_check
from metrale.rollout.fds import (
    FD_RESERVE,
    FDS_PER_ROLLOUT,
    FDS_PER_SANDBOXED_ROLLOUT,
    fd_concurrency_cap,
)
from metrale.rollout.pool import Progress, RolloutPlan, run_rollout, run_rollouts
from metrale.rollout.records import (
    STAGES,
    ErrorInfo,
    RolloutContext,
    RolloutRecord,
    RolloutTask,
    Stage,
    StageTiming,
    Tokens,
)
from metrale.rollout.summary import (
    ROLLOUT_METRICS,
    STAGE_METRICS,
    build_summary,
    summarize_records,
)
from metrale.rollout.teardown import finish

__all__ = [
    "FDS_PER_ROLLOUT",
    "FDS_PER_SANDBOXED_ROLLOUT",
    "FD_RESERVE",
    "ROLLOUT_METRICS",
    "STAGES",
    "STAGE_METRICS",
    "SUMMARY_STAGES",
    "BackgroundRun",
    "BenchmarkBase",
    "ErrorInfo",
    "Progress",
    "RolloutBenchmark",
    "RolloutContext",
    "RolloutPlan",
    "RolloutRecord",
    "RolloutTask",
    "Stage",
    "StageTiming",
    "Tokens",
    "bound_check",
    "build_summary",
    "fd_concurrency_cap",
    "finish",
    "run_rollout",
    "run_rollouts",
    "shown_stages",
    "summarize_records",
]
