"""The image builder: podman run as root of an unprivileged user namespace, so that nothing a
task's Dockerfile runs is host root.

Why not the engine's own build: the podman/buildah of Debian 12 (4.3.1 / 1.28.2) run every
build step as host root (their Docker-API build takes no user namespace, and a build with
`--userns-uid-map` cannot write the image's `/`), and they carry CVE-2024-1753 (a bind mount
from a stage's symlink to `/` is the host's root, read-write). Here `unshare` maps host uids
[BUILD_UID_BASE, +65536) to 0..65535 (through newuidmap and root's /etc/subuid range, which
scripts/container-engine.sh writes) and podman builds with chroot isolation in that namespace,
with its own store under `/var/lib/metrale/builder` (METRALE_BUILDER_DIR): host files owned
by root are `nobody` there, so a step that reaches the host's tree (that CVE or any other)
can neither read root's files nor write as root. Base images go in by `save`/`load` once per
image id; the built image comes out the same way into the engine the runtime uses, then
leaves the builder's store.

Used when metrale is root and the namespace can be made; otherwise the engine builds (the
Dockerfile refusal of build_mounts still applies), as docs/security.md says.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from metrale.runtime.docker import run_bytes

#: Host uids and gids of the builder's namespace: above every account, below the containers'
#: range (1_700_000_000, scripts/container-engine.sh) and bwrap's (1_800_000_000).
BUILD_UID_BASE = 1_690_000_000
BUILD_UID_COUNT = 65536
#: The namespace gets private /run, /dev/shm and /var/cache: podman's lock, runtime dir and
#: short-name cache there belong to host root and must not be shared with the engine.
_ENTER = (
    "mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /dev/shm && "
    'mount -t tmpfs tmpfs /var/cache && exec "$@"'
)
_ENV_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: The name base images keep in the builder's store.
BASE_NAME = "localhost/metrale-builder-base"


class BuilderError(Exception):
    """A step of the namespaced build failed; the message is its output's tail."""


#: How much of a failed build's log a rollout keeps (its last lines).
LOG_TAIL_LINES = 20
LOG_TAIL_CHARS = 2000


def log_tail(text: str) -> str:
    """The last `LOG_TAIL_LINES` non-empty lines of a build's log, at most `LOG_TAIL_CHARS`."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and "DEPRECATED" not in ln]
    return "\n".join(lines[-LOG_TAIL_LINES:])[-LOG_TAIL_CHARS:]


def subuid_range_ok(
    name: str = "root", files: tuple[str, str] = ("/etc/subuid", "/etc/subgid")
) -> bool:
    """Whether `name` owns [BUILD_UID_BASE, +BUILD_UID_COUNT) in both files (newuidmap's rule)."""
    for path in files:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return False
        covered = False
        for line in lines:
            parts = line.strip().split(":")
            if len(parts) != 3 or parts[0] != name or not parts[1].isdigit():
                continue
            start, count = int(parts[1]), int(parts[2]) if parts[2].isdigit() else 0
            end = BUILD_UID_BASE + BUILD_UID_COUNT
            covered |= start <= BUILD_UID_BASE and start + count >= end
        if not covered:
            return False
    return True


def builder_home() -> Path:
    """Not under root's home: the namespace's root is an unprivileged host uid that must
    reach its store, and /root is 0700."""
    return Path(os.environ.get("METRALE_BUILDER_DIR") or "/var/lib/metrale/builder")


def find_builder() -> Builder | None:
    """The namespaced builder, set up on first use, or None where it cannot run."""
    if os.geteuid() != 0 or not subuid_range_ok():
        return None
    if not all(shutil.which(tool) for tool in ("podman", "unshare", "newuidmap", "newgidmap")):
        return None
    builder = Builder(builder_home())
    builder.prepare()
    return builder


@dataclass(frozen=True)
class Builder:
    home: Path

    def prepare(self) -> None:
        """The builder's directories, owned by the namespace's root, and its two configs."""
        for sub in ("graph", "run", "tmp", "home", "work"):
            path = self.home / sub
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, BUILD_UID_BASE, BUILD_UID_BASE)
        os.chmod(self.home, 0o755)
        self._write("storage.conf", f'[storage]\ndriver = "overlay"\n'
                    f'graphroot = "{self.home}/graph"\nrunroot = "{self.home}/run"\n')  # fmt: skip
        self._write("containers.conf", '[engine]\ncgroup_manager = "cgroupfs"\n'
                    f'events_logger = "none"\ntmp_dir = "{self.home}/tmp"\n')  # fmt: skip

    def _write(self, name: str, text: str) -> None:
        path = self.home / name
        if not path.exists() or path.read_text() != text:
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_text(text)
            tmp.replace(path)

    def argv(self, *command: str, offline: bool = False) -> list[str]:
        """`command` as root of the builder's namespace, with a fixed environment; `offline`:
        in a network namespace of its own too (no interface but a loopback that is down)."""
        ids = f"{BUILD_UID_BASE},0,{BUILD_UID_COUNT}"
        return [
            "unshare", "--user", "--mount", *(["--net"] if offline else []),
            f"--map-users={ids}", f"--map-groups={ids}",
            "--setuid", "0", "--setgid", "0", "--",
            "env", "-i", f"PATH={_ENV_PATH}", f"HOME={self.home}/home",
            f"XDG_RUNTIME_DIR={self.home}/run", f"TMPDIR={self.home}/tmp",
            f"CONTAINERS_CONF={self.home}/containers.conf",
            f"CONTAINERS_STORAGE_CONF={self.home}/storage.conf",
            "sh", "-c", _ENTER, "enter", *command,
        ]  # fmt: skip

    async def _run(self, *command: str, stdin: bytes | None = None, timeout: float) -> bytes:
        code, out, err = await run_bytes(self.argv(*command), stdin=stdin, timeout=timeout)
        if code != 0:
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            raise BuilderError(" | ".join(lines[-3:])[:400] or f"exit {code}")
        return out

    async def has(self, image_id: str, *, timeout: float) -> bool:
        code, _, _ = await run_bytes(
            self.argv("podman", "image", "exists", image_id), timeout=timeout
        )
        return code == 0

    async def build(
        self,
        cli: str,
        context_tar: bytes,
        base_ids: list[str],
        label: str,
        *,
        timeout: float,
        extra: list[str] | None = None,
    ) -> str:
        """Builds the context in the namespace and loads the image into `cli`'s engine;
        returns its id there. Leaves nothing in the builder's store but the base images."""
        work = Path(tempfile.mkdtemp(prefix="build-", dir=self.home / "work"))
        os.chown(work, BUILD_UID_BASE, BUILD_UID_BASE)
        try:
            for image_id in base_ids:
                if not await self.has(image_id, timeout=timeout):
                    await self._transfer_in(cli, image_id, work, timeout=timeout)
            script = 'mkdir "$1/context" && tar -x -C "$1/context" && shift && exec podman "$@"'
            # chroot isolation runs RUN steps in the builder's own network namespace (podman
            # refuses --network with it): no network is that namespace having none
            offline = "--network=none" in (extra or [])
            extra = [a for a in (extra or []) if a != "--network=none"]
            argv = ["build", "--pull=never", "--isolation", "chroot", "--layers=false"]
            argv += [*extra, "--iidfile", f"{work}/iid", "--label", label]
            argv += ["-f", f"{work}/context/Dockerfile", f"{work}/context"]
            command = self.argv("sh", "-c", script, "build", str(work), *argv, offline=offline)
            code, out, err = await run_bytes(command, stdin=context_tar, timeout=timeout)
            if code != 0:  # the RUN steps' output is the build log: its tail says why
                raise BuilderError(log_tail(out.decode(errors="replace") + err) or f"exit {code}")
            built = (work / "iid").read_text().strip().removeprefix("sha256:")
            try:
                await self._run("podman", "save", "-o", f"{work}/image.tar", built, timeout=timeout)
            finally:
                await run_bytes(self.argv("podman", "rmi", "-f", built), timeout=timeout)
            code, _, err = await run_bytes(
                [cli, "load", "-i", f"{work}/image.tar"], timeout=timeout
            )
            if code != 0:
                raise BuilderError(f"{cli} load: {err.strip()[-300:]}")
            return built
        finally:
            shutil.rmtree(work, ignore_errors=True)

    async def _transfer_in(self, cli: str, image_id: str, work: Path, *, timeout: float) -> None:
        """A base image from the engine into the builder's store, by id."""
        archive = work / "base.tar"
        code, _, err = await run_bytes([cli, "save", "-o", str(archive), image_id], timeout=timeout)
        if code != 0:
            raise BuilderError(f"{cli} save {image_id[:12]}: {err.strip()[-300:]}")
        os.chown(archive, BUILD_UID_BASE, BUILD_UID_BASE)
        try:
            await self._run("podman", "load", "-q", "-i", str(archive), timeout=timeout)
        finally:
            archive.unlink(missing_ok=True)
        # named, or removing the first image built on it removes it too (an untagged parent)
        await self._run("podman", "tag", image_id, f"{BASE_NAME}:{image_id[:32]}", timeout=timeout)
