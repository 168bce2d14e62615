"""Diagnostics on stderr: `metrale -v` shows the `metrale` loggers' info and warnings, `-vv`
their debug lines and the tracebacks of the exceptions they log.

Every module logs with `logging.getLogger(__name__)`, so all of them sit under `metrale` and a
program that imports metrale configures them as it would any library's. The command line puts
one stderr handler on `metrale` and touches nothing else (the root logger, Ray's, asyncio's).
Without `-v` that handler passes only errors: what a user must see is already a line of the
command's own output, an exit code or an error on a rollout record; the log says why, for
whoever is debugging (a cleanup that failed, a sandbox that would not die, a file re-read).
"""

from __future__ import annotations

import logging
import sys
import types

#: what each count of `-v` shows: none (errors only), -v, -vv and more
LEVELS = (logging.ERROR, logging.INFO, logging.DEBUG)

_HANDLER_NAME = "metrale.cli"


class _Formatter(logging.Formatter):
    """`metrale: warning: message`; a logged exception's traceback only at debug level (at
    `-v` the message already names the exception)."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__("%(message)s")
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        return f"metrale: {record.levelname.lower()}: {super().format(record)}"

    def formatException(
        self,
        ei: tuple[type[BaseException], BaseException, types.TracebackType | None]
        | tuple[None, None, None],
    ) -> str:
        return super().formatException(ei) if self.tracebacks else ""


class _Stderr(logging.Handler):
    """Writes to whatever `sys.stderr` is when a line is logged: the live view redirects it
    while it draws on that terminal, so a line lands above the progress bar instead of being
    erased by its next redraw."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def configure(verbosity: int) -> None:
    """Route the `metrale` loggers to stderr at the level `verbosity` (the count of `-v`)
    asks for. Calling it again replaces the handler (tests run `main` many times)."""
    level = LEVELS[min(max(verbosity, 0), len(LEVELS) - 1)]
    logger = logging.getLogger("metrale")
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)
    handler = _Stderr()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(_Formatter(tracebacks=level <= logging.DEBUG))
    logger.addHandler(handler)
    logger.setLevel(level)
