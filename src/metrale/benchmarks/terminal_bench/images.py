"""A task's image: its base images found locally, built once per task with the engine's CLI,
cached by a hash of what went into it, and (for bwrap) its root file system exported once.

No registry is ever asked. Every `FROM` image must already be in the engine, or be mapped to
one that is (`base_image` mappings, `NAME=LOCAL`, and the defaults of `build_policy`:
`debian:bookworm` and the public Terminal-Bench base images run on metrale's own base image).
What the build's RUN steps may reach (network, the host's CA bundle) is `build_policy` too.
The build gets the Dockerfile with each `FROM` rewritten to the local image's id, so that
neither the docker CLI's legacy builder nor podman can try a pull. The tag is
`metrale-task/<name>:<hash>` where the hash covers every file of the environment directory
(path, executable bit, content) and the ids of the base images: an edited task or a rebuilt
base image builds again, anything else is reused. The build is timed apart from every
rollout's setup, and a failed build is data: each rollout of the run records it.

The bwrap runtime runs over the image's root exported once per image id into
`~/.cache/metrale/rootfs/<id>` (written to a temp dir and renamed, under a lock, so that two
runs never see half an export).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from metrale.benchmarks.terminal_bench.build_mounts import check_mounts
from metrale.benchmarks.terminal_bench.build_policy import BuildPolicy, local_base
from metrale.benchmarks.terminal_bench.builder import (
    Builder,
    BuilderError,
    find_builder,
    log_tail,
)
from metrale.benchmarks.terminal_bench.task import HarborTask
from metrale.errors import UsageError
from metrale.runtime.docker import is_podman, run_bytes
from metrale.runtime.procs import killpg

logger = logging.getLogger(__name__)
#: A build with the network and no CA bundle offered (a caller that chose no policy).
DEFAULT_POLICY = BuildPolicy()

BASE_IMAGE_OPTION = "--base-image NAME=LOCAL"
#: How long an `image inspect`, `create`, `rm` may take before the engine counts as hung.
CLI_TIMEOUT_S = 120.0


class ImageBuildError(Exception):
    """The task's image could not be built: recorded on every rollout of the task, with the
    build log's tail (`log`) in the record's metrics."""

    kind = "image_build"

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@dataclass
class TaskImage:
    """The built (or reused) image of one task and what a runtime needs to know of it."""

    tag: str
    image_id: str
    cached: bool
    build_s: float
    workdir: str | None
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    rootfs: Path | None = None
    export_s: float | None = None


def parse_base_images(text: str | None) -> dict[str, str]:
    """`NAME=LOCAL` mappings, separated by commas or spaces (the repeatable `--base-image`)."""
    mapping: dict[str, str] = {}
    for item in re.split(r"[,\s]+", text or ""):
        if not item:
            continue
        name, sep, local = item.partition("=")
        if not sep or not name or not local:
            raise UsageError(
                f"base image mapping {item!r} must be NAME=LOCAL (e.g. python:3.12=my/py:3.12)"
            )
        mapping[name] = local
    return mapping


def context_hash(task: HarborTask, base_ids: Mapping[str, str]) -> str:
    """sha256 over the environment directory (sorted relative paths, executable bit, bytes;
    symlinks by target) and the resolved base image ids."""
    digest = hashlib.sha256()
    root = task.environment_dir
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_file():
            executable = os.access(path, os.X_OK)
            digest.update(f"F {rel} {int(executable)} {path.stat().st_size}\n".encode())
            digest.update(path.read_bytes())
        elif path.is_dir():
            digest.update(f"D {rel}\n".encode())
    for name in sorted(base_ids):
        digest.update(f"B {name} {base_ids[name]}\n".encode())
    return digest.hexdigest()


def image_tag(task: HarborTask, digest: str) -> str:
    name = re.sub(r"[^a-z0-9._-]+", "-", task.name.lower()).strip("-._") or "task"
    return f"metrale-task/{name}:{digest[:16]}"


async def _cli(
    cli: str, *args: str, stdin: bytes | None = None, timeout: float = CLI_TIMEOUT_S
) -> tuple[int, bytes, str]:
    try:
        return await run_bytes([cli, *args], stdin=stdin, timeout=timeout)
    except TimeoutError:
        return 124, b"", f"'{cli} {args[0]}' did not finish in {timeout:g} s"
    except OSError as exc:
        return 127, b"", f"cannot run {cli!r}: {exc}"


async def inspect(cli: str, image: str) -> dict[str, Any] | None:
    """The engine's record of `image`, or None when it is not there."""
    code, out, _ = await _cli(cli, "image", "inspect", image)
    if code != 0:
        return None
    try:
        data = json.loads(out)
    except ValueError:
        return None
    return data[0] if isinstance(data, list) and data else None


async def resolve_bases(task: HarborTask, cli: str, mapping: Mapping[str, str]) -> dict[str, str]:
    """Each `FROM` image of the task (or its `docker_image`) -> the id of the local image it
    runs on. One that is absent is a UsageError naming it and the option that maps it."""
    resolved: dict[str, str] = {}
    for name in _wanted(task):
        local = local_base(name, mapping)
        info = await inspect(cli, local)
        if info is None:
            raise _absent(task, name, local)
        resolved[name] = str(info["Id"])
    return resolved


def check_bases(task: HarborTask, cli: str, mapping: Mapping[str, str]) -> None:
    """Blocking `resolve_bases`, for the checks made before a run starts (one line, exit 2);
    it may be called from inside the event loop's thread, so it never runs a loop itself."""
    for name in _wanted(task):
        local = local_base(name, mapping)
        try:
            probe = subprocess.run(
                [cli, "image", "inspect", "--format", "{{.Id}}", local],
                capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UsageError(f"cannot ask {cli!r} for image {local!r}: {exc}") from None
        if probe.returncode != 0:
            raise _absent(task, name, local)


def _wanted(task: HarborTask) -> list[str]:
    if task.environment.docker_image:
        return [task.environment.docker_image]
    return list(dict.fromkeys(task.dockerfile.bases)) if task.dockerfile else []


def _absent(task: HarborTask, name: str, local: str) -> UsageError:
    via = f" (mapped to {local!r}, which is not there either)" if local != name else ""
    return UsageError(
        f"task {task.name}: image {name!r}{via} is not present locally and metrale never "
        f"pulls; map it to a local image with {BASE_IMAGE_OPTION} "
        f"(-p base_image={name}=LOCAL), or build it first"
    )


def _rewrite_from(text: str, base_ids: Mapping[str, str]) -> str:
    """The Dockerfile with each base image of `base_ids` replaced by its local id."""

    def swap(match: re.Match[str]) -> str:
        head, image, tail = match.group(1), match.group(2), match.group(3)
        return f"{head}{base_ids.get(image, image)}{tail}"

    pattern = re.compile(r"^(\s*FROM\s+(?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE)
    return pattern.sub(swap, text)


def _context_tar(task: HarborTask, dockerfile: str) -> bytes:
    buf = io.BytesIO()
    # GNU format: podman's build endpoint reads no file from a PAX archive's Dockerfile
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        root = task.environment_dir
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            if rel == "Dockerfile":
                continue
            archive.add(path, arcname=rel, recursive=False)
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(data), 0o644
        archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def ensure_image(
    task: HarborTask,
    cli: str,
    mapping: Mapping[str, str],
    *,
    build_timeout_s: float,
    policy: BuildPolicy = DEFAULT_POLICY,
) -> TaskImage:
    """The task's image, built now or reused from the cache. Bad input (an absent base image)
    raises UsageError; a build that fails raises ImageBuildError with the build's last lines."""
    base_ids = await resolve_bases(task, cli, mapping)
    started = time.perf_counter()
    if task.environment.docker_image and task.dockerfile is None:
        tag, cached = task.environment.docker_image, True
        tag = local_base(tag, mapping)
    else:
        assert task.dockerfile is not None
        check_mounts(task.name, task.dockerfile.text)  # a HarborTask not made by load_task
        tag = image_tag(task, context_hash(task, base_ids))
        cached = await inspect(cli, tag) is not None
        if not cached:
            builder = await asyncio.to_thread(find_builder)
            if builder is not None:
                await _build_in_namespace(
                    builder, task, cli, tag, base_ids, build_timeout_s, policy
                )
            else:
                await _build_in_engine(task, cli, tag, base_ids, build_timeout_s, policy)
    info = await inspect(cli, tag)
    if info is None:
        raise ImageBuildError(f"image {tag} is not in the engine after its build")
    config = info.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    return TaskImage(
        tag=tag,
        image_id=str(info["Id"]).removeprefix("sha256:"),
        cached=cached,
        build_s=0.0 if cached else time.perf_counter() - started,
        workdir=config.get("WorkingDir") or None,
        env=env,
        user=config.get("User") or "",
    )


async def _build_in_namespace(
    builder: Builder,
    task: HarborTask,
    cli: str,
    tag: str,
    base_ids: Mapping[str, str],
    timeout_s: float,
    policy: BuildPolicy = DEFAULT_POLICY,
) -> None:
    """The build as root of an unprivileged user namespace (builder.py), tagged in the engine."""
    assert task.dockerfile is not None
    bare = {name: image_id.removeprefix("sha256:") for name, image_id in base_ids.items()}
    text = policy.dockerfile(_rewrite_from(task.dockerfile.text, bare))
    payload = _context_tar(task, text)
    label = "metrale.task=" + task.name
    try:
        async with asyncio.timeout(timeout_s):
            built = await builder.build(
                cli,
                payload,
                list(dict.fromkeys(bare.values())),
                label,
                timeout=timeout_s,
                extra=policy.engine_args(),
            )
    except TimeoutError:
        raise ImageBuildError(
            f"building {task.name}'s image did not finish in {timeout_s:g} s"
        ) from None
    except BuilderError as exc:
        last = str(exc).splitlines()[-1] if str(exc) else ""
        raise ImageBuildError(
            f"building {task.name}'s image failed: {last[:300]}", log=str(exc)
        ) from None
    code, _, err = await _cli(cli, "tag", built, tag)
    if code != 0:
        raise ImageBuildError(f"cannot tag {task.name}'s built image as {tag}: {err.strip()}")


async def _build_in_engine(
    task: HarborTask,
    cli: str,
    tag: str,
    base_ids: Mapping[str, str],
    timeout_s: float,
    policy: BuildPolicy = DEFAULT_POLICY,
) -> None:
    """The engine's own build, where the namespaced builder cannot run (not root, no subuid
    range): only build_mounts' refusal stands between the Dockerfile and host root."""
    assert task.dockerfile is not None
    argv = ["build", "-q", "-t", tag, "--label", "metrale.task=" + task.name]
    if is_podman(cli):
        argv.append("--pull=never")
    else:  # `docker build` mounts no volume: the CA bundle cannot be offered there
        policy = replace(policy, ca_file=None)
    argv += policy.engine_args()
    payload = _context_tar(task, policy.dockerfile(_rewrite_from(task.dockerfile.text, base_ids)))
    code, _, err = await _cli(cli, *argv, "-", stdin=payload, timeout=timeout_s)
    if code != 0:
        log = log_tail(err) or f"exit {code}"
        raise ImageBuildError(f"building {task.name}'s image failed: {log.splitlines()[-1]}", log)


def rootfs_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "metrale" / "rootfs"


async def export_rootfs(image: TaskImage, cli: str) -> Path:
    """The image's root file system as a host directory, exported once per image id."""
    cache = rootfs_cache()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / image.image_id[:32]
    done = cache / f"{target.name}.complete"
    if done.exists():
        image.rootfs, image.export_s = target, 0.0
        return target
    started = time.perf_counter()
    await prune_rootfs(cli, keep=target.name)
    lock = await asyncio.to_thread(_lock, cache / f"{target.name}.lock")
    try:
        if not done.exists():
            await _export(image.tag, cli, target)
            done.write_text(image.tag + "\n")
    finally:
        os.close(lock)
    image.rootfs, image.export_s = target, time.perf_counter() - started
    return target


async def prune_rootfs(cli: str, *, keep: str) -> list[Path]:
    """Remove exported roots whose image the engine no longer has (each is a few hundred MB;
    a task edited ten times would otherwise keep ten). Returns what it removed."""
    code, out, _ = await _cli(cli, "images", "-q", "--no-trunc")
    if code != 0:
        return []
    present = {line.strip().removeprefix("sha256:")[:32] for line in out.decode().splitlines()}
    removed: list[Path] = []
    for marker in rootfs_cache().glob("*.complete"):
        name = marker.name.removesuffix(".complete")
        if name == keep or name in present:
            continue
        await asyncio.to_thread(remove_rootfs, rootfs_cache() / name)
        removed.append(rootfs_cache() / name)
    return removed


def remove_rootfs(path: Path) -> None:
    """Blocking: an exported root, its marker and lock (the marker first: never half a root
    that looks complete)."""
    path.with_name(path.name + ".complete").unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    path.with_name(path.name + ".lock").unlink(missing_ok=True)


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def _export(tag: str, cli: str, target: Path) -> None:
    # the host's user namespace for this never-started container: in an engine that maps each
    # container's root to a subordinate uid (userns=auto), the export would carry those uids
    argv = ["create", "--userns=host", "--label", "metrale.sandbox=1", tag, "true"]
    code, out, err = await _cli(cli, *argv)
    if code != 0:
        raise ImageBuildError(f"cannot create a container of {tag} to export: {err.strip()}")
    container = out.decode().strip().splitlines()[-1]
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", '"$0" export "$1" | tar -x -C "$2" --numeric-owner --exclude="dev/*"',
            cli, container, str(partial), stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            _, stderr = await proc.communicate()
        except BaseException:  # cancelled: the export and tar go too
            killpg(proc.pid)
            await finish_wait(proc)
            raise
        if proc.returncode != 0:
            raise ImageBuildError(f"exporting {tag}'s file system failed: {stderr.decode()[-300:]}")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        rm = ["rm", "-f", *(["-t", "0"] if is_podman(cli) else []), container]
        try:
            code, _, err = await _cli(cli, *rm)
        except Exception as exc:  # must not hide why the export itself ended
            code, err = -1, repr(exc)
        if code != 0:  # labelled metrale.sandbox=1: 'metrale cleanup' removes it
            logger.warning("container %s (an export of %s) not removed: %s", container, tag, err)


async def finish_wait(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(Exception):
        await asyncio.shield(proc.wait())
