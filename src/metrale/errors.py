"""The two kinds of failure every layer may raise, and the exit codes they map to.

A `UsageError` is the user's mistake (bad flag, unknown benchmark, unreachable target): the CLI
prints its message as one line and exits 2, with no traceback. A `RunError` is a failure of the
run itself after it started (for example the embedded server died): one line, exit 3. Expected
per-rollout faults are neither: they are recorded on the rollout as data.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

EXIT_OK = 0
EXIT_VERDICT_FAILED = 1
EXIT_USAGE = 2
EXIT_RUN_FAILED = 3
#: Ctrl-C or SIGTERM, as a shell reports SIGINT (128 + 2), in the exit status and result.json
EXIT_INTERRUPTED = 130


class MetraleError(Exception):
    """Base for errors that the CLI turns into one line and an exit code."""

    exit_code = EXIT_RUN_FAILED


class UsageError(MetraleError):
    """Bad input: names the problem and what is accepted."""

    exit_code = EXIT_USAGE


class RecordWriteError(MetraleError):
    """A record could not be written (disk full, quota, I/O error): the run stops, exit 3."""

    exit_code = EXIT_RUN_FAILED


class RunError(MetraleError):
    """The run could not go on (not a single rollout's fault)."""

    exit_code = EXIT_RUN_FAILED


def read_user_file(path: Path | str, what: str) -> str:
    """The text of a file the user named (budgets, prompts, replay, sweep), as UTF-8.

    Every way such a file can be unreadable (missing, a directory, no permission, not UTF-8) is
    the user's mistake: one `UsageError` line naming the file, what it is for and what is
    accepted. The one place every user-given path is read through, so that no reader forgets a
    case and shows a traceback.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {path} is a directory; accepted: a file") from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{what} {path} is not UTF-8 text (byte {exc.start}); accepted: a UTF-8 file"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


# --------------------------------------------------------------------------- run-directory files

#: Sizes past which a file read from a run directory is refused: a run directory may come from
#: anyone (a colleague, a download), and a reader that trusts its sizes can be made to hang or
#: fill the memory. Each bound is far above what metrale writes (100,000 rollouts make a
#: ~60 MB rollouts.jsonl and a ~10 MB summary.json).
MAX_JSON_BYTES = 256 * 2**20
MAX_LOG_BYTES = 4 * 2**30
MAX_LINE_BYTES = 16 * 2**20
_CHUNK = 1 << 16


def _kind(mode: int) -> str:
    import stat

    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def open_data_file(path: Path | str, what: str, *, limit: int = MAX_JSON_BYTES) -> int:
    """A read-only descriptor of a regular file of at most `limit` bytes, else `UsageError`.

    Why so careful: a run directory is data someone else may have made. A FIFO would block
    `open` and `read` forever, `/dev/zero` (or a link to it) never ends, and opening some
    devices has effects of its own. So the path is checked with `stat` before it is opened (a
    link is followed only to see that it ends at a regular file), opened `O_NONBLOCK` (a FIFO
    swapped in meanwhile cannot block the open) and checked again on the descriptor.
    """
    import stat

    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(found.st_mode):
        raise UsageError(f"{what} {path} is a {_kind(found.st_mode)}; accepted: a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or opened.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise UsageError(
                f"{what} {path} is a {_kind(opened.st_mode)}; accepted: a regular file"
            )
        raise UsageError(
            f"{what} {path} is {opened.st_size} bytes; accepted: at most {limit} bytes"
        )
    return fd


def read_data_file(path: Path | str, what: str, *, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (`open_data_file`); a file that
    grows past `limit` while it is read is refused too."""
    fd = open_data_file(path, what, limit=limit)
    parts: list[bytes] = []
    size = 0
    try:
        while chunk := os.read(fd, min(_CHUNK * 16, limit + 1 - size) or 1):
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UsageError(f"{what} {path} is over {limit} bytes; accepted: at most that")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return b"".join(parts)


def data_lines(
    path: Path | str,
    what: str,
    *,
    limit: int = MAX_LOG_BYTES,
    line_limit: int = MAX_LINE_BYTES,
) -> Iterator[bytes]:
    """The lines of a regular file (`open_data_file`), each with its newline; the last one may
    lack it (a torn line). A line longer than `line_limit` is refused rather than gathered."""
    fd = open_data_file(path, what, limit=limit)
    try:
        pending: list[bytes] = []  # the parts of the line not yet ended
        pending_size = total = 0
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except OSError as exc:
                raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
            total += len(chunk)
            if total > limit:
                raise UsageError(f"{what} {path} is over {limit} bytes; accepted: at most that")
            if not chunk:
                break
            *whole, rest = chunk.split(b"\n")
            for part in whole:
                yield b"".join([*pending, part, b"\n"])
                pending, pending_size = [], 0
            pending.append(rest)
            pending_size += len(rest)
            if pending_size > line_limit:
                raise UsageError(
                    f"{what} {path} has a line over {line_limit} bytes; accepted: at most that"
                )
        if pending_size:
            yield b"".join(pending)
    finally:
        os.close(fd)
