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
from typing import Annotated, Any, BinaryIO, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metrale.endpoint.client import ClientOptions
from metrale.errors import (
    MAX_JSON_BYTES,
    RecordWriteError,
    UsageError,
    data_lines,
    read_data_file,
)
from metrale.plugin import Metric, RunSummary
from metrale.rollout import ROLLOUT_METRICS, RolloutRecord, summarize_records

#: Files a run writes; an existing directory with any of them belongs to an earlier run.
RUN_FILES = (
    "rollouts.jsonl",
    "result.json",
    "summary.json",
    "run.json",
    "requests.jsonl",
    "sessions.jsonl",
    "retried.jsonl",
)


# --------------------------------------------------------------------------- reading files back

#: A finite number: NaN and infinities in a file are refused like any other wrong type.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class StoredRun(BaseModel):
    """`run.json` as read back (by `--resume`, `report`, `compare`): the fields they use, each
    with its type. A run directory may come from anyone, so a field of the wrong type is a
    usage error naming the file and the field, never a traceback further on."""

    model_config = ConfigDict(strict=True, extra="allow")

    benchmark: str
    params: dict[str, Any] = Field(default_factory=dict)
    target: str = ""
    model: str = ""
    embedded: bool = False
    runtime: dict[str, Any] | None = None
    client: ClientOptions = Field(default_factory=ClientOptions)
    budgets: dict[str, FiniteFloat] = Field(default_factory=dict)
    metrale_version: str = ""
    started_at: str = ""


def field_error(exc: ValidationError) -> str:
    """The first problem of a validation, as `field: what is wrong` on one line."""
    err = exc.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return f"is not valid JSON ({err['msg'].partition(':')[2].strip() or 'truncated'})"
    where = ".".join(str(p) for p in err["loc"])
    msg = " ".join(str(err["msg"]).split())
    if not where:
        return f"is not a JSON object of the expected form ({msg})"
    return f"field {where}: {msg} (got {_shown(err.get('input'))})"


def _shown(value: object) -> str:
    text = json.dumps(value, default=str)[:60] if not isinstance(value, str) else repr(value[:60])
    return text


M = TypeVar("M", bound=BaseModel)
V = TypeVar("V", bound=RunSummary)


def read_model(
    path: Path, model: type[M], what: str, *, form: str = "", limit: int = MAX_JSON_BYTES
) -> M:
    """A JSON file of a run or sweep directory read as `model`: one `UsageError` line naming
    the file and the field for anything else (a list, a string, a wrong type, a truncation),
    and the file read with `read_data_file`'s bounds. `form` says what the file should be."""
    data = read_data_file(path, what, limit=limit)
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        problem = f"not {form}: {field_error(exc)}" if form else field_error(exc)
        raise UsageError(f"{what} {path}: {problem}") from None


def read_versioned(path: Path, model: type[V], what: str, *, form: str = "") -> V:
    """A summary or cell file (`RunSummary` and its kin), read as `read_model` reads, whose
    schema version is checked first (`RunSummary.from_file_data`: newer is one line)."""
    data = read_data_file(path, what)
    try:
        loaded = json.loads(data)
    except ValueError:
        problem = f"not {form}" if form else "not JSON"
        raise UsageError(f"{what} {path}: {problem} (it does not parse as JSON)") from None
    try:
        return model.from_file_data(loaded, path)
    except ValidationError as exc:
        problem = f"not {form}: {field_error(exc)}" if form else field_error(exc)
        raise UsageError(f"{what} {path}: {problem}") from None


def read_run_file(run_dir: Path) -> StoredRun:
    """`run_dir/run.json`, typed (`StoredRun`)."""
    return read_model(run_dir / "run.json", StoredRun, "run file")


@dataclass(frozen=True)
class ResumeScan:
    """What `prepare_resume` found and kept."""

    kept: frozenset[int]
    failed_moved: int
    torn_dropped: bool


#: The subdirectories benchmarks write per-rollout entries into: agent transcripts, and the
#: sandbox directories agentic_webserver lays out (and wipes when a rollout runs again).
WRITTEN_DIRS = ("transcripts", "sandboxes")


def check_no_links(path: Path) -> None:
    """Refuse a run directory whose entries (and those of `WRITTEN_DIRS`) are not plain files
    and directories. metrale writes there as whoever runs it, often root: a `rollouts.jsonl`,
    `result.json.tmp` or `transcripts/3.jsonl` that is a symbolic link would have it append to,
    truncate or replace any file on the host; metrale itself never makes a link there."""
    import stat

    for folder in (path, *(path / d for d in WRITTEN_DIRS)):
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            raise UsageError(f"run directory {path}: {folder.name} is not a directory") from None
        except OSError as exc:
            raise UsageError(f"run directory {path} cannot be read: {exc.strerror}") from None
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                kind = "symbolic link" if stat.S_ISLNK(mode) else "special file"
                raise UsageError(
                    f"run directory {path} holds a {kind}, {Path(entry.path).relative_to(path)}; "
                    "accepted: a directory of regular files, as metrale writes it"
                )


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
    if held and overwrite:
        check_no_links(path)
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


def read_run_info(path: Path) -> StoredRun:
    """`run.json` of a directory to resume; a UsageError when it is not a run."""
    if not path.is_dir():
        raise UsageError(f"--resume {path}: not a directory; accepted: a metrale run directory")
    info = read_run_file(path)
    check_no_links(path)
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"run directory {path} is not writable")
    return info


def scan_records(path: Path, count: int) -> tuple[dict[int, bool], int | None, int]:
    """Index -> failed? of each whole record of `rollouts.jsonl` (the first per index, indices
    in range only), the byte offset where a torn last line starts (None when none), and the
    number of whole lines. Every whole line must be a rollout record: the resumed run's
    summary is made of them."""
    from metrale.rollout import RolloutRecord

    found: dict[int, bool] = {}
    torn_at: int | None = None
    lines = 0
    log = path / "rollouts.jsonl"
    if not log.exists() and not log.is_symlink():
        return found, None, 0
    offset = 0
    for raw in data_lines(log, "rollout records"):
        start, offset = offset, offset + len(raw)
        if not raw.endswith(b"\n"):
            torn_at = start  # only the last line can lack its newline
            break
        lines += 1
        try:
            record = RolloutRecord.model_validate_json(raw)
        except ValidationError as exc:
            raise UsageError(
                f"--resume {path}: rollouts.jsonl line {lines} (byte {start}) {field_error(exc)}"
            ) from None
        index = record.index
        if 0 <= index < count and index not in found:
            found[index] = record.error is not None
    return found, torn_at, lines


def prepare_resume(path: Path, count: int, *, retry_errors: bool) -> ResumeScan:
    """Make `rollouts.jsonl` hold exactly the records to keep; return their indices."""
    found, torn_at, lines = scan_records(path, count)
    failed = {i for i, bad in found.items() if bad} if retry_errors else set()
    extra = lines - len(found)  # duplicates, or indices past a smaller count
    if failed or extra:
        _rewrite(path, keep=set(found) - failed)
    elif torn_at is not None:
        fd = os.open(path / "rollouts.jsonl", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, torn_at)
        finally:
            os.close(fd)
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
    retried = os.open(path / "retried.jsonl", _APPEND, 0o644)
    with _fresh(tmp) as dst, open(retried, "ab") as old:
        for raw in data_lines(log, "rollout records"):
            if not raw.endswith(b"\n"):
                break  # the torn tail
            index = json.loads(raw).get("index")  # `scan_records` read each line as a record
            if index in keep and index not in seen:
                seen.add(index)
                dst.write(raw)
            else:
                old.write(raw)
        dst.flush()
        os.fsync(dst.fileno())
    tmp.replace(log)


# --------------------------------------------------------------------------- files

#: Appending to a log of the run directory: never through a symbolic link.
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW


def _fresh(path: Path) -> BinaryIO:
    """`path` as a new file, opened for writing: whatever was there (a leftover temporary
    file, or a link someone placed) is removed first and the create is exclusive, so a write
    never goes through a link to another file."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return open(fd, "wb")


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
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
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
            with _fresh(tmp) as f:  # bytes as pydantic made them: no second copy
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
            with _fresh(tmp) as f:
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
        for line in data_lines(self.path, "rollout records"):
            if line.strip():
                yield json.loads(line)


def run_benchmark_id(run_dir: Path) -> str | None:
    """The benchmark a `metrale run` directory belongs to (from its run.json), or None."""
    try:
        return read_run_file(run_dir).benchmark
    except UsageError:
        return None


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
    """The rollout records of a run directory; a torn last line (a crash mid-write: no
    newline) is skipped. Any other line that is not a record is a usage error naming the line
    and the field; the file is read with `errors.data_lines`' bounds."""
    if not path.exists() and not path.is_symlink():
        return []
    records = []
    for i, line in enumerate(data_lines(path, "rollout records"), start=1):
        if not line.strip():
            continue
        try:
            records.append(RolloutRecord.model_validate_json(line))
        except ValidationError as exc:
            if not line.endswith(b"\n"):
                break
            raise UsageError(f"rollout records {path} line {i}: {field_error(exc)}") from None
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
    records: Sequence[RolloutRecord], benchmark: str, e2e_s: float | None, where: str = "a run"
) -> RunSummary:
    """The summary of a run whose result was never written (a crashed cell), from its records
    and `benchmark`'s declared metrics (`installed_metrics`). A declared metric whose records
    hold no number is one line naming the run's records, not a traceback."""
    try:
        return summarize_records(records, installed_metrics(benchmark), e2e_s)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"rollout records of {where}: a declared metric is not a number "
            f"({str(exc).splitlines()[0][:120]})"
        ) from None
