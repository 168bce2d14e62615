"""Commands in a live bwrap sandbox, forked inside it by the sandbox's own command.

The sandbox's own command (bwrap's first child, which holds the sandbox alive) is a `sh`, the
executor (`EXECUTOR`). metrale writes it one script per command on its stdin; it forks the
command there, so a command costs a fork and the command's own `exec`. Entered from the host
instead, each command was four programs (a gate `sh` moved into the cgroups, `nsenter`,
`env -i`, then the command): 6.4 ms of CPU against 1.5 ms for a fork inside, on the bwrap
cell's two cores (docs/measurements.md, "the command route").

A command therefore inherits everything from the executor, set once by the host at the start:
the namespaces, uid 1000 inside (the sandbox's host uid outside), the cgroups, the rlimits but
CPU time (which counts per process, so it is set per command by `ulimit -t`), and the
executor's environment, which bwrap clears (`--clearenv`; `PATH` only). The command's own
environment is exported in its subshell just before its `exec`: nothing of it runs on the host.

The protocol, per command `N`:

- metrale makes `N.o`, `N.e` (and `N.i` for stdin) as FIFOs owned by the sandbox's host uid
  in the sandbox's control directory, which bwrap binds read-only at `CONTROL` (the sandbox
  cannot make, remove or replace anything there; a FIFO opens for writing on a read-only
  mount). It opens its ends first, then writes the script, which the executor reads as the
  rest of its own input (every word single-quoted, newlines and all; `command_script`).
- The executor runs the script: it forks W (stdin `/dev/null`) and answers `N pid P`,
  W's pid in the sandbox. W opens the FIFOs and answers `N open` (or `N exit 126` when it
  cannot), runs the command in a subshell (`cd`, `PWD` unset, `ulimit -t`, `export`, `exec`),
  answers `N exit STATUS` and ends, which closes W's ends of the FIFOs.
- Answers come on the executor's stdout, one `echo` each (shorter than PIPE_BUF, so whole).

What metrale trusts of them: nothing it does not check. A process inside can write answers
too (W's fd 4 is reachable through `/proc`), so an answer can at worst end its own sandbox's
command early or misstate its status: the sandbox's own outputs, untrusted anyway. Lines are
bounded, unknown ids ignored, and a pid named by an answer is used only to kill processes
found in the sandbox's PID namespace (`SandboxProcess.kill_tree`).

What a command's end means: its `exit` answer, or both FIFOs at EOF with no answer (W was
killed: status 137, as a shell reports SIGKILL), or the executor's stdout at EOF (the sandbox
died: `SandboxLostError`, from `BwrapCommands`). A timeout kills W's process tree, parents
first (status 124). A command that kills the executor and exits at once can have its status
answered before the executor has died (a SIGKILL takes effect when its target next runs): its
result stands, and the sandbox is found lost at the next command.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from metrale.runtime.base import ProgramResult
from metrale.runtime.procs import PIPE_GRACE_S, CappedBuffer, Limits, captured

#: Where the sandbox sees its control directory (`bwrap_setup.control_dir`), read-only.
CONTROL = "/run/metrale"
#: The executor: a shell that reads its script from its stdin, which metrale writes to. dash
#: and busybox read it 8 KB a `read(2)`; a `while read -r l; do eval "$l"; done` loop read
#: it a byte a `read(2)` (so does any shell's `read`), 5,700 system calls for gsm8k's grader.
EXECUTOR = ["sh", "-s"]


#: Signals the executor and each command's W ignore and the command gets back at their
#: defaults: a command's `kill 0` (SIGTERM to its process group, as `trap 'kill 0' EXIT` does)
#: reaches the executor and W too, since without job control every process of the sandbox
#: shares one group, and would end the sandbox. SIGKILL cannot be ignored: `kill -9 0` still
#: does. (SIGINT and SIGQUIT a background command ignores anyway, as POSIX has it.)
SHIELDED = "HUP TERM USR1 USR2 ALRM"


def executor_preamble(limits: Limits, *, address_space: bool) -> bytes:
    """What metrale writes first to the executor's stdin. It lowers the executor's rlimits,
    soft and hard, to `limits` (CPU seconds aside: they count per process, so each command
    gets its own, `command_script`; address space only with `address_space`), before anything
    else runs in the sandbox, so every command inherits them and none can raise them. (Set
    from the host, they would need CAP_SYS_RESOURCE over the sandbox's host uid, which a
    container's root often lacks.) Then it ignores `SHIELDED`, answers "ready" and sends its
    stderr to /dev/null; a script per command follows (`command_script`). EOF on its stdin
    (metrale gone, or `stop()`) ends it, and with it the sandbox. Processes are `-p` to dash
    and `-u` to bash and busybox."""
    steps = []
    if limits.max_procs is not None:
        n = int(limits.max_procs)
        steps.append(f"{{ ulimit -p {n} 2>/dev/null || ulimit -u {n}; }}")
    if address_space and limits.memory_mb is not None:
        steps.append(f"ulimit -v {int(limits.memory_mb) << 10}")  # KiB
    if limits.file_size_mb is not None:
        steps.append(f"ulimit -f {int(limits.file_size_mb) << 11}")  # 512-byte blocks
    bound = " && ".join(steps) + " || exit 1\n" if steps else ""
    return (bound + f"trap '' {SHIELDED}; echo ready; exec 2>/dev/null\n").encode()


#: An answer longer than this is not one of the executor's.
ANSWER_MAX = 128
#: How long a command whose FIFOs both reached EOF waits for its `exit` answer before it is
#: taken as killed (W ends right after that answer, so it is normally already on its way).
ANSWER_GRACE_S = 0.2
KILLED = 137
#: How long a command whose W was killed waits to see whether the executor ended too (the
#: sandbox was lost, not just the command killed).
LOST_GRACE_S = 1.0
#: Kills the process tree of a pid of the sandbox (`SandboxProcess.kill_tree`; blocking).
KillTree = Callable[[int], object]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FIFO_MODE = 0o600


@dataclass
class _Command:
    """One command in flight: what the executor answered for it so far."""

    pid: asyncio.Future[int]
    opened: asyncio.Future[None]
    exited: asyncio.Future[int]
    #: names in the control directory, until W has opened them
    fifos: list[str] = field(default_factory=list)


def command_script(
    n: int,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    cpu_s: int | None,
    *,
    stdin: bool,
) -> str:
    """The script the executor runs for command `n` (see the module docstring): one complete
    shell command, so the executor runs it as soon as it has read it."""
    for part in (*argv, *env, *env.values(), cwd or ""):
        if "\0" in part:
            raise ValueError("embedded null byte")
    q = shlex.quote
    base = f"{CONTROL}/{n}"
    inputs = f"<{q(base + '.i')} " if stdin else ""
    steps = [f"trap - {SHIELDED}"]  # the command's own: as they were
    if cwd:
        steps.append(f"cd -- {q(cwd)} || exit")
    steps.append("unset PWD OLDPWD")
    if cpu_s is not None:
        steps.append(f"ulimit -t {int(cpu_s)} || exit 126")
    names = [k for k in env if k]
    if all(_NAME.match(k) for k in names):
        steps += [f"export {k}={q(env[k])}" for k in names]
        steps.append("exec " + " ".join(q(a) for a in argv))
    else:  # a name no shell can export (`a.b`): `env -i` sets the whole environment
        assignments = " ".join(q(f"{k}={env[k]}") for k in names if "=" not in k)
        steps.append(f"exec env -i -- {assignments} " + " ".join(q(a) for a in argv))
    command = "; ".join(steps)
    return (
        f"{{ exec 4>&1; command exec {inputs}>{q(base + '.o')} 2>{q(base + '.e')} "
        f'|| {{ echo "{n} exit 126" >&4; exit; }}; echo "{n} open" >&4; '
        f'( {command} ) 4>&-; echo "{n} exit $?" >&4; }} </dev/null 2>/dev/null & '
        f'echo "{n} pid $!"\n'
    )


class _Answers(asyncio.Protocol):
    """The executor's stdout: one answer a line, handed to `Executor.answer`."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            self.executor.answer(line)
        if len(self.pending) > ANSWER_MAX:  # not an answer of ours: drop it
            self.pending = b""

    def connection_lost(self, exc: Exception | None) -> None:
        self.executor.gone()


class Executor:
    """The host's side of one sandbox's executor: its stdin (scripts) and stdout (answers)
    as pipe transports, the control directory (`bwrap_setup.control_dir`), the sandbox's
    host uid (the FIFOs' owner) and the commands in flight."""

    def __init__(self, control: Path, owner: tuple[int, int] | None) -> None:
        #: the control directory, held open: a FIFO made, opened and removed through it costs
        #: a tenth of the same by path (0.017 against 0.23 ms, measured, with the cell's
        #: sandboxes' mounts on the host)
        self._dir = os.open(control, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.owner = owner
        self._ids = itertools.count(1)
        self._pending: dict[int, _Command] = {}
        self._scripts: asyncio.WriteTransport | None = None
        self._reader: asyncio.ReadTransport | None = None
        self._answers: asyncio.Future[bytes] | None = None
        self.ended = asyncio.get_running_loop().create_future()

    async def attach(
        self, stdin: IO[bytes], stdout: IO[bytes], preamble: bytes, ready_timeout: float
    ) -> bytes:
        """Take the executor's pipes (closed with this executor), write it `preamble`
        (`executor_preamble`) and return its first answer: b"ready\\n" once the preamble
        has run (b"" if none came within `ready_timeout`)."""
        loop = asyncio.get_running_loop()
        self._answers = loop.create_future()
        self._reader, _ = await loop.connect_read_pipe(lambda: _Answers(self), stdout)
        self._scripts, _ = await loop.connect_write_pipe(asyncio.Protocol, stdin)
        self._scripts.write(preamble)
        try:
            return await asyncio.wait_for(asyncio.shield(self._answers), ready_timeout)
        except TimeoutError:
            return b""

    def answer(self, line: bytes) -> None:
        if self._answers is not None and not self._answers.done():
            self._answers.set_result(line + b"\n")
            return
        parts = line.split(b" ")
        if len(line) > ANSWER_MAX or len(parts) not in (2, 3) or not parts[0].isdigit():
            return  # not an answer of the executor's (a process inside can write here too)
        command = self._pending.get(int(parts[0]))
        if command is None:
            return
        what, value = parts[1], parts[2] if len(parts) == 3 else b""
        try:
            if what == b"pid" and not command.pid.done():
                command.pid.set_result(int(value))
            elif what == b"open" and not command.opened.done():
                command.opened.set_result(None)
            elif what == b"exit" and not command.exited.done():
                command.exited.set_result(int(value))
        except ValueError:
            return

    def gone(self) -> None:
        """The executor's stdout closed: it (and so the sandbox) ended."""
        if self._answers is not None and not self._answers.done():
            self._answers.set_result(b"")
        if not self.ended.done():
            self.ended.set_result(None)

    def close(self) -> None:
        """Close both pipes (the executor reads EOF on its stdin and ends, as `cat` did) and
        the control directory. Idempotent."""
        for transport in (self._scripts, self._reader):
            if transport is not None:
                transport.close()
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1

    def _fifos(self, n: int, stdin: bool) -> list[str]:
        made: list[str] = []
        try:
            for suffix in ("o", "e", "i") if stdin else ("o", "e"):
                name = f"{n}.{suffix}"
                os.mkfifo(name, _FIFO_MODE, dir_fd=self._dir)
                made.append(name)
                if self.owner is not None:
                    os.chown(name, *self.owner, dir_fd=self._dir, follow_symlinks=False)
        except OSError:
            self._unlink(made)
            raise
        return made

    def _open(self, name: str, flags: int) -> int:
        return os.open(name, flags | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=self._dir)

    def _unlink(self, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self._dir)
        names.clear()

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        timeout: float | None,
        stdin: bytes | None,
        cap: int,
        cpu_s: int | None,
        kill_tree: KillTree,
        out: CappedBuffer | None = None,
    ) -> ProgramResult:
        """Run one command (see the module docstring). `kill_tree(pid)` kills the process
        tree of a pid of the sandbox (blocking; run in a thread). `out`, when given, takes
        the command's stdout as bytes (the result's `stdout` is its text). RuntimeError when
        the executor has ended; the caller tells a lost sandbox from it."""
        if self.ended.done() or self._scripts is None:
            raise RuntimeError("the sandbox's executor has ended")
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        n = next(self._ids)
        script = command_script(n, argv, env, cwd, cpu_s, stdin=stdin is not None).encode()
        command = _Command(loop.create_future(), loop.create_future(), loop.create_future())
        command.fifos = self._fifos(n, stdin is not None)
        fds: list[int] = []
        closers: list[_Closes] = []
        out, err = out or CappedBuffer(cap), CappedBuffer(cap)
        timed_out = False
        self._pending[n] = command
        try:
            fds = [self._open(name, os.O_RDONLY | os.O_NONBLOCK) for name in command.fifos[:2]]
            if stdin is not None:  # read-write: opening never waits, and holds the data
                fds.append(self._open(command.fifos[2], os.O_RDWR | os.O_NONBLOCK))
            self._scripts.write(script)
            deadline = None if timeout is None else loop.time() + timeout
            try:
                code = await self._finish(command, fds, closers, out, err, stdin, deadline)
            except TimeoutError:
                timed_out = True
                code = 124
                await self._kill(command, kill_tree)
        except BaseException:
            if command.pid.done() and not command.exited.done():
                await asyncio.shield(self._kill(command, kill_tree))
            raise
        finally:
            del self._pending[n]
            for closer in closers:
                closer.close()
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._unlink(command.fifos)
        return captured(code, out, err, timed_out, started)

    async def _finish(
        self,
        command: _Command,
        fds: list[int],
        closers: list[_Closes],
        out: CappedBuffer,
        err: CappedBuffer,
        stdin: bytes | None,
        deadline: float | None,
    ) -> int:
        """Await command's end (TimeoutError past `deadline`); returns its status."""
        loop = asyncio.get_running_loop()

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - loop.time())

        await _first(left(), command.opened, command.exited, self.ended)
        if not command.opened.done():  # W could not open, or the executor ended
            return command.exited.result() if command.exited.done() else KILLED
        closed = []
        for fd, buffer in ((fds[0], out), (fds[1], err)):
            drain = _Drain(loop, fd, buffer)
            closers.append(drain)
            closed.append(drain.closed)
        if stdin is not None:
            await self._feed(command.fifos[2], stdin, closers)
            os.close(fds.pop())  # held only so that W's open did not wait
        self._unlink(command.fifos)  # opened: the sandbox cannot open them again
        both = _all(closed)
        await _first(left(), command.exited, both)
        if not command.exited.done():  # W's ends closed: its answer is due, or it died
            with contextlib.suppress(TimeoutError):
                await _first(ANSWER_GRACE_S, command.exited)
        if not command.exited.done():  # W was killed: by a kill inside (`kill -9 -1`) that
            with contextlib.suppress(TimeoutError):  # takes the executor too, a moment
                await _first(LOST_GRACE_S, self.ended)  # later, or by one that does not
        code = command.exited.result() if command.exited.done() else KILLED
        # background children may still hold the FIFOs: take what is there, then let go
        with contextlib.suppress(TimeoutError):
            await _first(PIPE_GRACE_S, both)
        return code

    async def _feed(self, name: str, data: bytes, closers: list[_Closes]) -> None:
        """Write `data` to the FIFO W reads as stdin, then EOF. Through a write-only end of
        its own: asyncio takes a readable write end for a closed reader, and the read-write
        end that kept W's open from waiting is readable while data waits in it."""
        try:
            fd = self._open(name, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader left: W is gone, and its end says how
            return
        loop = asyncio.get_running_loop()
        writing, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(fd, "wb", 0))
        closers.append(writing)
        with contextlib.suppress(OSError):
            writing.write(data)
            writing.write_eof()

    async def _kill(self, command: _Command, kill_tree: KillTree) -> None:
        """Kill W's process tree, once the executor has named W (it may not have, if it
        ended first: then so did the sandbox)."""
        with contextlib.suppress(TimeoutError):
            await _first(1.0, command.pid, self.ended)
        if command.pid.done():
            await asyncio.to_thread(kill_tree, command.pid.result())

    def killed_all(self) -> None:
        """Every process of the sandbox but the executor was just killed (`kill_commands`):
        a command whose W had not yet opened its FIFOs will never answer, so it ends now as
        killed (one that had ends at its FIFOs' EOF, as any killed W)."""
        for command in self._pending.values():
            if not command.opened.done() and not command.exited.done():
                command.exited.set_result(KILLED)


async def _first(timeout: float | None, *futures: asyncio.Future[Any]) -> None:
    """Wait until one of `futures` is done (TimeoutError after `timeout`)."""
    if any(f.done() for f in futures):
        return
    done, _ = await asyncio.wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")
    if not done:
        raise TimeoutError


def _all(futures: list[asyncio.Future[None]]) -> asyncio.Future[None]:
    """Done once every one of `futures` is (they are only ever given a result)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    left = len(futures)

    def one(_: asyncio.Future[None]) -> None:
        nonlocal left
        left -= 1
        if left == 0 and not done.done():
            done.set_result(None)

    for future in futures:
        future.add_done_callback(one)
    return done


class _Closes(Protocol):
    def close(self) -> None: ...


class _Drain:
    """One of a command's output FIFOs read on the loop into `buffer` (`closed` done at its
    EOF): a reader callback on metrale's fd, which stays the caller's to close. A pipe
    transport per FIFO (a dup, a file object, connection callbacks) was a tenth of the event
    loop's callbacks in the 512-sandbox cell."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, buffer: CappedBuffer) -> None:
        self.loop, self.fd, self.buffer = loop, fd, buffer
        self.closed: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.buffer.add(data)
            return
        self.close()
        if not self.closed.done():
            self.closed.set_result(None)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            self.fd = -1
