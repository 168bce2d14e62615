"""The modal emulator's task command router: the data plane the SDK reaches with the URL and JWT
that `TaskGetCommandRouterAccess` hands out (`TaskExecStart`, `TaskExecStdioRead`,
`TaskExecWait`/`TaskExecPoll`, stdin writes).

A command runs in the sandbox's real runtime (its `run`, which caps and times it); its output is
kept until read. The SDK's filesystem API is an exec of `modal-sandbox-fs-tools` with a JSON
request: the router answers `ReadFile`, `WriteFile`, `MakeDirectory` and `Remove` itself through
the runtime's `read`/`write`, and fails any other request loudly (exit 1, logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

if TYPE_CHECKING:
    from grpclib.server import Stream

    from metrale.runtime.base import Runtime

logger = logging.getLogger(__name__)

FS_TOOLS = "/__modal/.bin/modal-sandbox-fs-tools"
#: The most a command's stdout or stderr keeps here (the SDK's reader takes it in chunks).
OUTPUT_CAP_BYTES = 256 << 20
CHUNK = 1 << 20


@dataclass
class Exec:
    """One command: its output as it was kept, its exit code once known, its stdin."""

    exec_id: str
    stdout: bytes = b""
    stderr: bytes = b""
    code: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    stdin: bytearray = field(default_factory=bytearray)
    stdin_closed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass
class Task:
    """The router's side of one running sandbox."""

    task_id: str
    runtime: Runtime
    env: dict[str, str] = field(default_factory=dict)
    execs: dict[str, Exec] = field(default_factory=dict)
    lost: bool = False


class Router:
    """The task command router service (`TaskCommandRouterBase`'s methods, by name).

    `check_jwt(stream, task_id)` refuses a call without the task's token; `gateway_fails()`
    draws whether a command's router is lost mid-command, and `lose(task)` loses it."""

    def __init__(
        self,
        tasks: dict[str, Task],
        check_jwt: Callable[[Any, str], None],
        gateway_fails: Callable[[], bool],
        lose: Callable[[Task], Coroutine[Any, Any, None]],
    ) -> None:
        self._tasks = tasks
        self._check_jwt = check_jwt
        self._gateway_fails = gateway_fails
        self._lose = lose
        self._losing: set[asyncio.Task[None]] = set()

    def _task(self, stream: Stream[Any, Any], task_id: str) -> Task:
        self._check_jwt(stream, task_id)
        task = self._tasks.get(task_id)
        if task is None or task.lost:
            raise GRPCError(Status.NOT_FOUND, f"task {task_id} not found")
        return task

    def _exec(self, stream: Stream[Any, Any], task_id: str, exec_id: str) -> tuple[Task, Exec]:
        task = self._task(stream, task_id)
        found = task.execs.get(exec_id)
        if found is None:
            raise GRPCError(Status.NOT_FOUND, f"exec {exec_id} not found")
        return task, found

    async def TaskExecStart(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import task_command_router_pb2 as sr

        req = await stream.recv_message()
        assert req is not None
        task = self._task(stream, req.task_id)
        if req.exec_id in task.execs:
            await stream.send_message(sr.TaskExecStartResponse())  # an idempotent retry
            return
        run = Exec(req.exec_id)
        task.execs[req.exec_id] = run
        env = {**task.env, **env_of(req)}
        run.task = asyncio.create_task(_execute(task, run, list(req.command_args), env, req))
        if self._gateway_fails():  # lost mid-command: started, and no call reaches it again
            task.lost = True
            losing = asyncio.create_task(self._lose(task))
            self._losing.add(losing)
            losing.add_done_callback(self._losing.discard)
        await stream.send_message(sr.TaskExecStartResponse())

    async def TaskExecStdioRead(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import task_command_router_pb2 as sr

        req = await stream.recv_message()
        assert req is not None
        task, run = self._exec(stream, req.task_id, req.exec_id)
        await _until(run.done, task)
        out = (
            run.stderr
            if req.file_descriptor == sr.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR
            else run.stdout
        )
        for offset in range(int(req.offset), len(out), CHUNK):
            await stream.send_message(
                sr.TaskExecStdioReadResponse(data=out[offset : offset + CHUNK])
            )

    async def TaskExecWait(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import task_command_router_pb2 as sr

        req = await stream.recv_message()
        assert req is not None
        task, run = self._exec(stream, req.task_id, req.exec_id)
        await _until(run.done, task)
        await stream.send_message(sr.TaskExecWaitResponse(code=run.code or 0))

    async def TaskExecPoll(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import task_command_router_pb2 as sr

        req = await stream.recv_message()
        assert req is not None
        _, run = self._exec(stream, req.task_id, req.exec_id)
        if run.code is None:
            await stream.send_message(sr.TaskExecPollResponse())
        else:
            await stream.send_message(sr.TaskExecPollResponse(code=run.code))

    async def TaskExecStdinWrite(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import task_command_router_pb2 as sr

        req = await stream.recv_message()
        assert req is not None
        _, run = self._exec(stream, req.task_id, req.exec_id)
        _stdin_at(run, int(req.offset), req.data, req.eof)
        await stream.send_message(sr.TaskExecStdinWriteResponse())

    async def TaskExecStdinWriteStream(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import task_command_router_pb2 as sr

        run: Exec | None = None
        offset = 0
        async for msg in stream:
            if msg.HasField("start"):
                _, run = self._exec(stream, msg.start.task_id, msg.start.exec_id)
                offset = int(msg.start.offset)
            elif run is None:
                raise GRPCError(Status.INVALID_ARGUMENT, "stdin stream without a start message")
            elif msg.HasField("end"):
                _stdin_at(run, offset, b"", True)
            else:
                _stdin_at(run, offset, msg.data, False)
                offset += len(msg.data)
        await stream.send_message(sr.TaskExecStdinWriteStreamResponse())

    async def TaskExecStdinStatus(self, stream: Stream[Any, Any]) -> None:
        from modal_proto import task_command_router_pb2 as sr

        req = await stream.recv_message()
        assert req is not None
        _, run = self._exec(stream, req.task_id, req.exec_id)
        await stream.send_message(
            sr.TaskExecStdinStatusResponse(
                num_bytes_written=len(run.stdin), closed=run.stdin_closed.is_set()
            )
        )


def env_of(req: Any) -> dict[str, str]:
    """The environment a request carries: `env` entries, and the inline secret sources the SDK
    turns an `env` dict into. A stored secret (by id) does not exist here: loud."""
    env = dict(getattr(req, "env", {}))
    for source in req.secret_sources:
        if source.secret_id:
            raise GRPCError(Status.UNIMPLEMENTED, "modal emulator: stored secrets are not emulated")
        env.update(source.env.contents)
    return env


def _stdin_at(run: Exec, offset: int, data: bytes, eof: bool) -> None:
    """Stdin writes are idempotent by offset (the SDK resends after a broken stream)."""
    if offset > len(run.stdin):
        raise GRPCError(Status.FAILED_PRECONDITION, f"stdin offset {offset} past {len(run.stdin)}")
    run.stdin[offset:] = data
    if eof:
        run.stdin_closed.set()


async def _until(event: asyncio.Event, task: Task) -> None:
    """Wait for `event`; a task lost meanwhile ends the call as the real router's loss does."""
    while not event.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), 0.5)
        if task.lost:
            raise GRPCError(Status.NOT_FOUND, f"task {task.task_id} not found")


async def _execute(
    task: Task, run: Exec, argv: list[str], env: dict[str, str] | None, req: Any
) -> None:
    try:
        if argv and argv[0] == FS_TOOLS:
            await _fs_tools(task.runtime, run, argv[1:])
        else:
            result = await task.runtime.run(
                argv,
                env=env,
                cwd=req.workdir or None,
                timeout=float(req.timeout_secs) if req.timeout_secs else None,
            )
            run.stdout, run.stderr = _raw(result.stdout), _raw(result.stderr)
            run.code = result.exit_code
    except Exception as exc:  # the sandbox went away under the command: the task is lost
        logger.warning("exec %s in task %s failed: %r", run.exec_id, task.task_id, exc)
        run.stderr, run.code = str(exc).encode(), 137
    finally:
        if run.code is None:
            run.code = 137
        run.done.set()


def _raw(text: str) -> bytes:
    """The runtime gives text (undecodable bytes replaced); the SDK reads bytes."""
    return text.encode("utf-8", "surrogateescape")


async def _fs_tools(runtime: Runtime, run: Exec, args: list[str]) -> None:
    """The filesystem requests the SDK sends (JSON: `{"ReadFile": {"path": ...}}` etc.)."""
    try:
        request = json.loads(args[0]) if args else {}
        (op, body), *_ = request.items()
        path = str(body["path"])
    except (ValueError, KeyError, AttributeError, TypeError):
        run.stderr, run.code = f"unreadable fs-tools request {args!r}".encode(), 2
        return
    try:
        if op == "ReadFile":
            run.stdout = await runtime.read(path)
        elif op == "WriteFile":
            await run.stdin_closed.wait()
            await runtime.write(path, bytes(run.stdin))
        elif op == "MakeDirectory":
            flag = ["-p"] if body.get("create_parents", True) else []
            made = await runtime.run(["mkdir", *flag, "--", path])
            if made.exit_code != 0:
                raise OSError(made.stderr.strip())
        elif op == "Remove":
            flag = ["-r"] if body.get("recursive") else []
            removed = await runtime.run(["rm", "-f", *flag, "--", path])
            if removed.exit_code != 0:
                raise OSError(removed.stderr.strip())
        else:
            logger.error("modal emulator: fs-tools request %s is not implemented", op)
            run.stderr, run.code = f"emulator: fs-tools {op} is not implemented".encode(), 1
            return
        run.code = 0
    except FileNotFoundError as exc:
        error = {"error_kind": "NotFound", "message": str(exc)}
        run.stderr, run.code = json.dumps(error).encode(), 1
    except OSError as exc:
        error = {"error_kind": "Io", "message": str(exc)}
        run.stderr, run.code = json.dumps(error).encode(), 1
