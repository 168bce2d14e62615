"""The run directory's life: a new one, one refused, one resumed.

A run directory holds `run.json`, `rollouts.jsonl` and `result.json` (see `runner`). This module
decides what may be done to an existing one:

- a **new run** into a directory that already holds records is refused (exit 2, nothing
  touched) unless `overwrite`, which removes the old records and result first;
- a **resumed run** keeps every record whose index is in range and, unless `retry_errors`,
  every failed one; the rollouts without a kept record are run again. `rollouts.jsonl` stays
  one record per index: a torn last line (a crash mid-write) is dropped, and with
  `retry_errors` the failed records are moved (atomically: a new file, then a rename) to
  `retried.jsonl`, so the summary of the resumed run counts each rollout once and the failed
  attempts are still on disk.
"""

from __future__ import annotations

import contextlib
import json
import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from pydantic import BaseModel, ValidationError

from metrale.errors import RecordWriteError, UsageError, read_user_file
from metrale.plugin import Metric, RunSummary
from metrale.rollout import ROLLOUT_METRICS, RolloutRecord, summarize_records

#: Files a run writes; an existing directory with any of them belongs to an earlier run.
RUN_FILES = (
    "rollouts.jsonl",
    "result.json",
    "summary.json",
    "run.json",
    "requests.jsonl",
    "retried.jsonl",
)


@dataclass(frozen=True)
class ResumeScan:
    """What `prepare_resume` found and kept."""

    kept: frozenset[int]
    failed_moved: int
    torn_dropped: bool


def check_new(path: Path, *, overwrite: bool) -> list[str]:
    """Refuse, touching nothing, a path a new run may not use; the earlier run's files held."""
    if str(path) == "":
        raise UsageError("--out is empty; accepted: a directory path")
    try:
        is_dir = path.is_dir()
        if path.exists() and not is_dir:
            raise UsageError(f"run directory {path} exists and is not a directory")
        held = [name for name in RUN_FILES if is_dir and (path / name).exists()]
    except OSError as exc:
        raise UsageError(f"run directory {path} cannot be used: {exc.strerror}") from None
    if held and not overwrite:
        raise UsageError(
            f"run directory {path} already holds a run ({', '.join(held)}); "
            "accepted: --resume to finish it, --overwrite to replace it, or another --out"
        )
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"run directory {path} is not writable")
    return held


def create_new(path: Path, *, overwrite: bool) -> Path:
    """Make `path` for a new run; refuse one holding an earlier run's records."""
    held = check_new(path, overwrite=overwrite)
    try:
        path.mkdir(parents=True, exist_ok=True)
        for name in held:
            (path / name).unlink()
    except OSError as exc:
        raise UsageError(f"cannot create run directory {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"run directory {path} is not writable")
    return path


def read_run_info(path: Path) -> dict[str, Any]:
    """`run.json` of a directory to resume, as a dict; a UsageError when it is not a run."""
    if not path.is_dir():
        raise UsageError(f"--resume {path}: not a directory; accepted: a metrale run directory")
    text = read_user_file(path / "run.json", "run file")
    try:
        info = json.loads(text)
    except ValueError:
        raise UsageError(f"--resume {path}: run.json is not JSON") from None
    if not isinstance(info, dict) or not isinstance(info.get("benchmark"), str):
        raise UsageError(f"--resume {path}: run.json names no benchmark")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"run directory {path} is not writable")
    return info


def scan_records(path: Path, count: int) -> tuple[dict[int, bool], int | None, int]:
    """Index -> failed? of each whole record of `rollouts.jsonl` (the first per index, indices
    in range only), the byte offset where a torn last line starts (None when none), and the
    number of whole lines."""
    found: dict[int, bool] = {}
    torn_at: int | None = None
    lines = 0
    log = path / "rollouts.jsonl"
    if not log.exists():
        return found, None, 0
    offset = 0
    with log.open("rb") as f:
        for raw in f:
            start, offset = offset, offset + len(raw)
            lines += 1
            if not raw.endswith(b"\n"):
                torn_at = start  # only the last line can lack its newline
                lines -= 1
                break
            try:
                row = json.loads(raw)
                index = row["index"]
            except (ValueError, KeyError, TypeError):
                raise UsageError(
                    f"--resume {path}: rollouts.jsonl has a damaged line at byte {start}"
                ) from None
            if isinstance(index, int) and 0 <= index < count and index not in found:
                found[index] = row.get("error") is not None
    return found, torn_at, lines


def prepare_resume(path: Path, count: int, *, retry_errors: bool) -> ResumeScan:
    """Make `rollouts.jsonl` hold exactly the records to keep; return their indices."""
    found, torn_at, lines = scan_records(path, count)
    failed = {i for i, bad in found.items() if bad} if retry_errors else set()
    extra = lines - len(found)  # duplicates, or indices past a smaller count
    if failed or extra:
        _rewrite(path, keep=set(found) - failed)
    elif torn_at is not None:
        with (path / "rollouts.jsonl").open("r+b") as f:
            f.truncate(torn_at)
    return ResumeScan(
        kept=frozenset(set(found) - failed),
        failed_moved=len(failed),
        torn_dropped=torn_at is not None,
    )


def _rewrite(path: Path, keep: set[int]) -> None:
    """Keep the first record of each index in `keep`; the rest go to `retried.jsonl`. The new
    rollouts.jsonl is written beside the old one and renamed over it: a crash here leaves one
    or the other, never half."""
    log = path / "rollouts.jsonl"
    tmp = path / "rollouts.jsonl.tmp"
    seen: set[int] = set()
    with log.open("rb") as src, tmp.open("wb") as dst, (path / "retried.jsonl").open("ab") as old:
        for raw in src:
            if not raw.endswith(b"\n"):
                break  # the torn tail
            index = json.loads(raw).get("index")
            if index in keep and index not in seen:
                seen.add(index)
                dst.write(raw)
            else:
                old.write(raw)
        dst.flush()
        os.fsync(dst.fileno())
    tmp.replace(log)


# --------------------------------------------------------------------------- files


@dataclass
class RunArtifacts:
    """The run directory and its append-only logs (`rollouts.jsonl`, `requests.jsonl`, ...).

    Each line is written with one `os.write` on an unbuffered descriptor, so a line is on disk
    when `append_*` returns; a write that fails part-way (ENOSPC) is cut back to the last whole
    line and raises `RecordWriteError`: every earlier record stays intact and parseable.
    """

    run_dir: Path
    _fds: dict[str, int] = field(default_factory=dict, repr=False)
    _sizes: dict[str, int] = field(default_factory=dict, repr=False)

    def path(self, name: str) -> Path:
        return self.run_dir / name

    def open(self, name: str = "rollouts.jsonl") -> None:
        """Open a log now, before any work: a run that cannot write its records does not
        start (and a low fd limit cannot take this descriptor away later)."""
        if name not in self._fds:
            try:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                self._fds[name] = fd = os.open(self.run_dir / name, flags, 0o644)
                self._sizes[name] = os.fstat(fd).st_size  # appends only: we track the end
            except OSError as exc:
                where = self.run_dir / name
                raise RecordWriteError(f"cannot open {where}: {exc.strerror}") from None

    def append_record(self, record: BaseModel) -> None:
        """Append one JSON line to rollouts.jsonl: a crash loses no finished rollout."""
        self.append_line("rollouts.jsonl", record)

    def append_line(self, name: str, record: BaseModel) -> None:
        """Append one JSON line to a log in the run directory (e.g. `requests.jsonl`)."""
        self.open(name)
        fd = self._fds[name]
        data = (record.model_dump_json() + "\n").encode()
        offset = self._sizes[name]
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            self._sizes[name] = offset + len(data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, offset)  # no torn line: the file ends at the last whole record
            raise RecordWriteError(
                f"cannot write to {self.run_dir / name}: {exc.strerror}; "
                "the records before this one are intact"
            ) from None

    def write_json(self, name: str, model: BaseModel, indent: int | None = 2) -> Path:
        """Write a JSON file atomically (temporary file, then rename): never half a file."""
        target = self.run_dir / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        try:
            with tmp.open("wb") as f:  # bytes as pydantic made them: no second copy
                f.write(model.__pydantic_serializer__.to_json(model, indent=indent))
                f.write(b"\n")
            tmp.replace(target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise RecordWriteError(f"cannot write {target}: {exc.strerror}") from None
        return target

    def write_summary(self, summary: RunSummary, name: str = "summary.json") -> Path:
        """Write the run's summary atomically, its per-rollout arrays streamed in chunks: at
        100,000 rollouts a summary holds ~600,000 numbers, and as Python floats they would
        cost 32 bytes each at once (`dump_summary`)."""
        target = self.run_dir / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        try:
            with tmp.open("wb") as f:
                dump_summary(summary, f)
            tmp.replace(target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise RecordWriteError(f"cannot write {target}: {exc.strerror}") from None
        return target

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class ResumeRecords:
    """What a resumed run already holds: the indices with a record that is kept (not re-run).

    The kept records themselves are read back from `rollouts.jsonl` with `records()`, one at a
    time, so that the summary covers every record without holding them all.
    """

    path: Path
    indices: frozenset[int]

    def records(self) -> Iterator[dict[str, Any]]:
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def run_benchmark_id(run_dir: Path) -> str | None:
    """The benchmark a `metrale run` directory belongs to (from its run.json), or None."""
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    bench = info.get("benchmark") if isinstance(info, dict) else None
    return bench if isinstance(bench, str) else None


#: Numbers per chunk when a summary's arrays are written.
_CHUNK = 8192


def dump_summary(summary: RunSummary, f: BinaryIO) -> None:
    """`summary` as one compact JSON object (what `RunSummary.model_validate_json` reads),
    its `durations` and `samples` written a chunk of numbers at a time."""
    head = orjson.dumps(summary.model_dump(mode="json", exclude={"durations", "samples"}))
    f.write(head[:-1])  # the object stays open for the two tables
    for key in ("durations", "samples"):
        table: dict[str, Any] = getattr(summary, key)
        f.write(b',"' + key.encode() + b'":{')
        for i, (name, values) in enumerate(table.items()):
            f.write((b"," if i else b"") + orjson.dumps(name) + b":")
            if not isinstance(values, array):
                f.write(orjson.dumps(values))
                continue
            f.write(b"[")
            for start in range(0, len(values), _CHUNK):
                chunk = orjson.dumps(values[start : start + _CHUNK].tolist())[1:-1]
                f.write((b"," if start else b"") + chunk)
            f.write(b"]")
        f.write(b"}")
    f.write(b"}\n")


def read_records(path: Path) -> list[RolloutRecord]:
    """The rollout records of a run directory; a torn last line (a crash mid-write) is skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(RolloutRecord.model_validate_json(line))
        except ValidationError:
            if i == len(lines) - 1:
                break
            raise UsageError(f"{path}:{i + 1} is not a rollout record") from None
    return records


def installed_metrics(benchmark: str) -> list[Metric]:
    """The metrics `benchmark` declares as installed now, or the standard rollout ones when it
    is not installed: what a summary that stores no declarations (schema 1) is read with, and
    what a run's records are summarized by."""
    from metrale.plugin import get_benchmark

    try:
        return get_benchmark(benchmark)().metrics()
    except UsageError:
        return list(ROLLOUT_METRICS)


def summarize_run_records(
    records: Sequence[RolloutRecord], benchmark: str, e2e_s: float | None
) -> RunSummary:
    """The summary of a run whose result was never written (a crashed cell), from its records
    and `benchmark`'s declared metrics (`installed_metrics`)."""
    return summarize_records(records, installed_metrics(benchmark), e2e_s)
