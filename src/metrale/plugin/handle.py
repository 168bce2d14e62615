"""What the runner hands a benchmark: its target, its run directory, run-wide options.

The run directory is seen through the `Artifacts` protocol (the runner's `rundir.RunArtifacts`
implements it), so that this contract does no I/O. `Target`, `ClientOptions` and
`RuntimeConfig` are named for type checkers only: the contract does not import the endpoint or
runtime layers at run time; the objects themselves come from the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

if TYPE_CHECKING:  # typing only: see the module docstring
    from metrale.endpoint.client import ClientOptions, Target
    from metrale.runtime.base import RuntimeConfig


class Artifacts(Protocol):
    """The run directory and its append-only logs (`rollouts.jsonl`, `requests.jsonl`, ...).
    Each appended line is on disk when the call returns; a failed write raises
    `errors.RecordWriteError` and leaves every earlier line intact."""

    run_dir: Path

    def path(self, name: str) -> Path: ...

    def open(self, name: str = "rollouts.jsonl") -> None: ...

    def append_record(self, record: BaseModel) -> None: ...

    def append_line(self, name: str, record: BaseModel) -> None: ...

    def write_json(self, name: str, model: BaseModel, indent: int | None = 2) -> Path: ...


class TelemetryWindow(Protocol):
    """The server's own telemetry while the run loads it (`metrale.endpoint.scrape`)."""

    def summary(self, start: float, end: float) -> dict[str, float | None]:
        """Telemetry metrics over [start, end] (perf_counter seconds); {} without samples."""
        ...


class Resume(Protocol):
    """What a resumed run already holds: the indices with a kept record, and those records."""

    @property
    def indices(self) -> frozenset[int]: ...  # read-only: a frozen record meets it

    def records(self) -> Iterator[dict[str, Any]]: ...


@dataclass
class PluginHandle:
    """Everything a benchmark gets from the runner. `client_options` and `runtime` are the
    run-wide flags (the CLI has refused those the benchmark does not honour); `runtime` is None
    for in-process rollouts. `target` is None when the benchmark needs no model."""

    target: Target | None
    artifacts: Artifacts
    client_options: ClientOptions
    runtime: RuntimeConfig | None = None
    runtime_retries: int = 0
    on_status: Callable[[str], None] = lambda phase: None
    on_progress: Callable[[int, int | None], None] = lambda done, total: None
    cancelled: Callable[[], bool] = lambda: False
    #: set when the run resumes a run directory (`metrale run --resume`)
    resume: Resume | None = None
    #: the target's `/metrics` samples, when the runner samples them (`metrale.telemetry`)
    telemetry: TelemetryWindow | None = None
