"""The two kinds of failure every layer may raise, and the exit codes they map to.

A `UsageError` is the user's mistake (bad flag, unknown benchmark, unreachable target): the CLI
prints its message as one line and exits 2, with no traceback. A `RunError` is a failure of the
run itself after it started (for example the embedded server died): one line, exit 3. Expected
per-rollout faults are neither: they are recorded on the rollout as data.
"""

from __future__ import annotations

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
