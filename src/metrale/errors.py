"""The two kinds of failure every layer may raise, and the exit codes they map to.

A `UsageError` is the user's mistake (bad flag, unknown benchmark, unreachable target): the CLI
prints its message as one line and exits 2, with no traceback. A `RunError` is a failure of the
run itself after it started (for example the embedded server died): one line, exit 3. Expected
per-rollout faults are neither: they are recorded on the rollout as data.
"""

EXIT_OK = 0
EXIT_VERDICT_FAILED = 1
EXIT_USAGE = 2
EXIT_RUN_FAILED = 3


class MetraleError(Exception):
    """Base for errors that the CLI turns into one line and an exit code."""

    exit_code = EXIT_RUN_FAILED


class UsageError(MetraleError):
    """Bad input: names the problem and what is accepted."""

    exit_code = EXIT_USAGE


class RunError(MetraleError):
    """The run could not go on (not a single rollout's fault)."""

    exit_code = EXIT_RUN_FAILED
