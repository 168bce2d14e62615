"""What a person watching a run sees: a live view on a terminal, plain lines in a log, or none.

The runner hands every event to a `View` (`make_view` picks it) and knows nothing else:

- `RichView` (a terminal): a progress bar with done/total, the rate and the ETA, and below it
  what the benchmark's live snapshot carries (`BenchmarkResult`): errors, retries, the running
  mean reward and running p50s (generation and total for rollouts; TTFT and TPOT for serve,
  with its level), and the turns so far for agentic benchmarks. Log lines print above it. It is
  drawn at most every `refresh_s`, by the caller's own thread (no refresh thread of its own),
  so a run with thousands of records per second pays for a few renders a second, not one per
  record.
- `PlainView` (a pipe or a file): one line when the progress changed, at most every 2 s, and
  a heartbeat every 30 s; the final line always.
- no stream (`--quiet`): nothing.

Text the view did not write (a log line, a phase or summary from a benchmark, an error from a
sandbox or an image build) goes through `fmt.safe_text`: it is shown, never obeyed by the
terminal, and rich's markup is never parsed in it (plain `Text`, `markup=False`).

The rate is finished units (rollouts, or requests) per second of this phase, measured by the
view from the first snapshot of the phase; the ETA is what is left at that rate.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TextIO

from metrale.fmt import clock_text, duration_text, number_text, rate_text, safe_text
from metrale.plugin import BenchmarkResult, LogLine, Status

if TYPE_CHECKING:
    from rich.console import RenderableType

_PREFIX = {"info": "", "warn": "warning: ", "error": "error: "}


class View(Protocol):
    def phase(self, name: str) -> None: ...
    def progress(self, done: int, total: int | None) -> None: ...
    def snapshot(self, result: BenchmarkResult) -> None: ...
    def log(self, line: LogLine) -> None: ...
    def close(self) -> None: ...


def make_view(stream: TextIO | None, *, terminal: bool | None = None) -> View:
    """The view for `stream`: rich on a terminal (`terminal` overrides the detection; a
    `TERM=dumb` terminal gets plain lines), plain lines otherwise, nothing for None."""
    if stream is None:
        return PlainView(None)
    if terminal is None:
        terminal = _isatty(stream) and os.environ.get("TERM") != "dumb"
    return RichView(stream) if terminal else PlainView(stream)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class PlainView:
    """Lines for a log: when what they say changed (at most every `interval_s`), a heartbeat
    every `heartbeat_s`, and the final one always."""

    def __init__(self, stream: TextIO | None, interval_s: float = 2.0) -> None:
        self.stream = stream
        self.interval_s = interval_s
        self.heartbeat_s = 30.0
        self._last_emit = 0.0
        self._last_key = ""
        self._phase = ""

    def _write(self, text: str, *, force: bool = False, key: str | None = None) -> None:
        if self.stream is None:
            return
        key = text if key is None else key
        now = time.monotonic()
        since = now - self._last_emit
        changed = key != self._last_key
        if force or (changed and since >= self.interval_s) or since >= self.heartbeat_s:
            self.stream.write(safe_text(text) + "\n")
            self.stream.flush()
            self._last_emit, self._last_key = now, key

    def phase(self, name: str) -> None:
        if name != self._phase:
            self._phase = name
            self._write(f"[{name}]", force=True)

    def progress(self, done: int, total: int | None) -> None:
        self._write(f"[{self._phase}] {done}/{total if total is not None else '?'}")

    def snapshot(self, result: BenchmarkResult) -> None:
        key = f"[{result.phase}] {result.summary}"
        text = f"{key}  ({result.elapsed_s:.1f} s)"
        self._write(text, force=result.status is not Status.RUNNING, key=key)

    def log(self, line: LogLine) -> None:
        if self.stream is None:
            return
        self.stream.write(_PREFIX[line.level] + safe_text(line.message) + "\n")
        self.stream.flush()

    def close(self) -> None:
        pass


class RichView:
    """The live view on a terminal (see the module docstring)."""

    def __init__(
        self, stream: TextIO, refresh_s: float = 0.25, clock: Callable[[], float] = time.monotonic
    ) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=stream, force_terminal=True, highlight=False)
        self.live = Live(
            console=self.console,
            auto_refresh=False,
            redirect_stdout=False,
            # a log line (`metrale -v`) printed above the view, not erased by its next redraw
            redirect_stderr=stream is sys.stderr,
            transient=False,
        )
        self.refresh_s = refresh_s
        self.clock = clock
        self._phase = ""
        self._done = 0
        self._total: int | None = None
        self._last: BenchmarkResult | None = None
        self._drawn_at = 0.0
        self._started = False
        self._rate_from: tuple[float, int] | None = None

    # ------------------------------------------------------------------ events

    def phase(self, name: str) -> None:
        if name != self._phase:
            self._phase = name
            self._rate_from = None
            self._last = None
            self._draw(force=True)

    def progress(self, done: int, total: int | None) -> None:
        self._done, self._total = done, total
        self._draw()

    def snapshot(self, result: BenchmarkResult) -> None:
        self._last = result
        if result.phase and result.phase != self._phase and result.status is Status.RUNNING:
            self._phase, self._rate_from = result.phase, None
        self._done, self._total = result.done, result.total
        self._draw(force=result.status is not Status.RUNNING)

    def log(self, line: LogLine) -> None:
        style = {"info": "", "warn": "yellow", "error": "bold red"}[line.level]
        self._start()
        text = _PREFIX[line.level] + safe_text(line.message)
        self.live.console.print(text, style=style, markup=False, highlight=False, emoji=False)

    def close(self) -> None:
        if self._started:
            self._draw(force=True)
            self.live.stop()
            self._started = False

    # ------------------------------------------------------------------ drawing

    def _start(self) -> None:
        if not self._started:
            self.live.start(refresh=False)
            self._started = True

    def _draw(self, *, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._drawn_at < self.refresh_s:
            return
        self._drawn_at = now
        self._start()
        self.live.update(self.render(now), refresh=True)

    def rate(self, now: float) -> float | None:
        """Units finished per second since the phase's first progress was seen."""
        if self._rate_from is None or self._done < self._rate_from[1]:
            self._rate_from = (now, self._done)
            return None
        t0, d0 = self._rate_from
        if now - t0 < 0.5 or self._done == d0:
            return None
        return (self._done - d0) / (now - t0)

    def render(self, now: float | None = None) -> RenderableType:
        """The view as it would be drawn now (tests read it without a terminal)."""
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        now = self.clock() if now is None else now
        done, total, snap = self._done, self._total, self._last
        rate = self.rate(now)
        eta = (total - done) / rate if rate and total is not None else None
        if total is not None and done >= total:
            eta = 0.0
        head = Table.grid(padding=(0, 1))
        for _ in range(6):
            head.add_column(no_wrap=True)
        bar = ProgressBar(total=float(total) if total else None, completed=float(done), width=32)
        count = f"{done}/{total}" if total is not None else f"{done}"
        pct = f"{100 * done / total:.0f}%" if total else ""
        elapsed = clock_text(snap.elapsed_s) if snap is not None else ""
        head.add_row(
            Text(safe_text(self._phase, lines=False) or "…", style="bold cyan"),
            bar,
            Text(f"{count} {pct}".strip()),
            Text(rate_text(rate)),
            Text(f"ETA {clock_text(eta)}"),
            Text(f"elapsed {elapsed}" if elapsed else ""),
        )
        parts: list[RenderableType] = [head]
        details = self.details(snap)
        if details:
            parts.append(Text(safe_text("  " + " · ".join(details), lines=False), style="dim"))
        return Group(*parts)

    @staticmethod
    def details(snap: BenchmarkResult | None) -> list[str]:
        """The second line: what the benchmark's snapshot carries, in `metrale.fmt` numbers."""
        if snap is None:
            return []
        out = []
        if snap.level is not None:
            out.append(f"level {snap.level}")
        if snap.in_flight is not None:
            out.append(f"in flight {snap.in_flight}")
        if snap.errors is not None:
            out.append(f"errors {snap.errors}")
        if snap.retries is not None:
            out.append(f"retries {snap.retries}")
        if snap.reward_mean is not None:
            out.append(f"reward {number_text(snap.reward_mean)}")
        out += [f"{name} p50 {duration_text(s)}" for name, s in snap.running_p50_s.items()]
        if snap.turns is not None:
            out.append(f"turns {snap.turns}")
        if not out and snap.summary:
            out.append(snap.summary)
        return out
