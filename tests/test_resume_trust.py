"""Issue 21 item 4: a run directory is data. `run --resume` takes from run.json no executable,
no bind or other widening of a sandbox, and no target for the user's credentials; it says
what it will use before any work."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import Sim, run_cli, start_sim
from tests.runtime.conftest import HAVE_BWRAP

ROLLOUTS = 4


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    with start_sim() as s:
        yield s


def _run(sim: Sim, out: Path, *extra: str) -> Path:
    proc = run_cli([
        "run", "gsm8k", "--target", sim.url, "--no-preflight", "--quiet", "--out", str(out),
        "--rollouts", str(ROLLOUTS), "--max-tokens", "4", *extra,
    ], timeout=120, env=_env())  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    return out


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    return {**env, **extra}


@pytest.fixture(scope="module")
def finished(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(sim, tmp_path_factory.mktemp("finished") / "run", "--runtime", "subprocess")


def _copy(run_dir: Path, tmp_path: Path, *, unfinished: bool = False) -> Path:
    """A copy of `run_dir`; `unfinished`: its last two records and its result gone, so that a
    resume has rollouts to run."""
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    if unfinished:
        log = copy / "rollouts.jsonl"
        log.write_text("".join(log.read_text().splitlines(keepends=True)[:-2]))
        for name in ("result.json", "summary.json"):
            (copy / name).unlink(missing_ok=True)
    return copy


def _edit_run_json(run_dir: Path, **changes: Any) -> None:
    info = json.loads((run_dir / "run.json").read_text())
    info.update(changes)
    (run_dir / "run.json").write_text(json.dumps(info))


def _resume(run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> Any:
    return run_cli(
        ["run", "--resume", str(run_dir), "--no-preflight", "--quiet", *extra],
        timeout=120,
        env=env or _env(),
    )


def test_resume_runs_no_docker_cli_named_by_run_json(finished: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\necho 99.0\n")
    evil.chmod(0o755)
    run_dir = _copy(finished, tmp_path)
    _edit_run_json(run_dir, runtime={"type": "docker", "cli": str(evil)})
    proc = _resume(run_dir)  # as the user would: nothing but the directory
    assert not marker.exists(), "resume ran the executable run.json named"
    assert proc.returncode == 2, proc.stderr
    assert "--runtime docker" in proc.stderr and "Traceback" not in proc.stderr
    proc = _resume(run_dir, "--runtime", "docker")
    assert not marker.exists(), "resume ran the executable run.json named"
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "cli=" in line and "--docker-cli" in line and str(evil) in line


@pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap is not usable here")
def test_resume_binds_no_host_path_named_by_run_json(sim: Sim, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    before = os.stat(victim / "keep")
    run_dir = _copy(_run(sim, tmp_path / "run", "--runtime", "bwrap"), tmp_path, unfinished=True)
    info = json.loads((run_dir / "run.json").read_text())
    runtime = {**info["runtime"], "binds": [{"src": str(victim), "writable": True}]}
    _edit_run_json(run_dir, runtime=runtime)
    assert _resume(run_dir).returncode == 2  # as the user would: nothing but the directory
    proc = _resume(run_dir, "--runtime", "bwrap")
    after = os.stat(victim / "keep")
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (
        before.st_uid,
        before.st_gid,
        stat.S_IMODE(before.st_mode),
    )
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "binds=" in line and "--bind" in line and "Traceback" not in proc.stderr
    # the user who does want that bind says so with the flag, and the run goes on
    confirmed = _resume(run_dir, "--runtime", "bwrap", "--bind", str(victim))
    assert confirmed.returncode in (0, 1), confirmed.stderr


#: run.json's runtime, tampered: each must be refused (the field named), whatever the runtime.
TAMPERED: list[tuple[str, dict[str, Any], str]] = [
    ("subprocess", {"env": {"LD_PRELOAD": "/tmp/x.so"}}, "env"),
    ("subprocess", {"limits": {"memory_mb": None, "max_procs": None}}, "limits"),
    ("subprocess", {"output_cap_bytes": 0}, "output_cap_bytes"),
    ("bwrap", {"binds": [{"src": "/etc", "writable": True}]}, "binds"),
    ("bwrap", {"network": True}, "network"),
    ("bwrap", {"root": "/"}, "root"),
    ("bwrap", {"seed": "/root"}, "seed"),
    ("bwrap", {"scratch": ["/proc"]}, "scratch"),
    ("docker", {"cli": "/bin/true"}, "cli"),
    ("docker", {"network": "host"}, "network"),
    ("docker", {"image": "attacker/image"}, "image"),
    ("ray", {"address": "10.0.0.1:6379"}, "address"),
]


@pytest.mark.parametrize(("kind", "change", "field"), TAMPERED)
def test_a_tampered_runtime_is_refused_before_any_work(
    finished: Path, tmp_path: Path, kind: str, change: dict[str, Any], field: str
) -> None:
    run_dir = _copy(finished, tmp_path)
    _edit_run_json(run_dir, runtime={"type": kind, **change})
    held = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    proc = _resume(run_dir, "--runtime", kind)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("metrale: error:") and f"{field}=" in line, proc.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == held  # nothing touched


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization") or "")
        self.send_response(404)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    seen: ClassVar[list[str]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_api_key_goes_only_to_a_target_the_user_names(
    finished: Path, sim: Sim, tmp_path: Path, listener: tuple[str, list[str]]
) -> None:
    url, seen = listener
    run_dir = _copy(finished, tmp_path, unfinished=True)
    _edit_run_json(run_dir, target=url)
    keyed = _env(OPENAI_API_KEY="sk-secret-of-the-user")
    proc = _resume(run_dir, "--runtime", "subprocess", env=keyed)
    assert seen == [], "the user's key was sent to run.json's target"
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert url in line and "--target" in line and "Traceback" not in proc.stderr
    # --api-key is the user's key too
    proc = _resume(run_dir, "--runtime", "subprocess", "--api-key", "sk-flag")
    assert proc.returncode == 2 and seen == [], proc.stderr
    # naming another target than the run's is a conflict, as before
    other = _resume(run_dir, "--runtime", "subprocess", "--target", sim.url, env=keyed)
    assert other.returncode == 2 and "conflicts" in other.stderr and seen == []


def test_a_confirmed_resume_says_what_it_uses_before_any_work(
    finished: Path, sim: Sim, tmp_path: Path
) -> None:
    run_dir = _copy(finished, tmp_path, unfinished=True)
    keyed = _env(OPENAI_API_KEY="sk-secret-of-the-user")
    proc = _resume(run_dir, "--runtime", "subprocess", "--target", sim.url, env=keyed)
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stderr.splitlines()
    said = next(i for i, line in enumerate(lines) if line.startswith("resuming "))
    assert sim.url.rstrip("/") in lines[said] and "with your API key" in lines[said]
    assert "subprocess" in lines[said + 1]
    assert said < next(i for i, line in enumerate(lines) if line.startswith("run directory:"))
    records = (run_dir / "rollouts.jsonl").read_text().splitlines()
    assert sorted(json.loads(r)["index"] for r in records) == list(range(ROLLOUTS))
    # with no key at all, the recorded target is called as it is (nothing to leak)
    again = _copy(finished, tmp_path / "again", unfinished=True)
    plain = _resume(again, "--runtime", "subprocess")
    assert plain.returncode in (0, 1), plain.stderr
    assert "with no API key" in plain.stderr


@pytest.mark.parametrize(
    "name",
    ["rollouts.jsonl", "result.json.tmp", "retried.jsonl", "transcripts/1.jsonl", "sandboxes/1"],
)
def test_resume_writes_through_no_link_in_the_run_dir(
    finished: Path, tmp_path: Path, name: str
) -> None:
    """A link where metrale writes would have it append to, truncate or replace any file on
    the host, as whoever runs it: the resume is refused and the file is untouched."""
    run_dir = _copy(finished, tmp_path, unfinished=True)
    victim = tmp_path / "victim"
    if name == "rollouts.jsonl":  # the records, moved out and linked back
        shutil.move(run_dir / name, victim)
    elif name.startswith("sandboxes/"):  # a rollout's sandbox dir, wiped when it runs again
        victim.mkdir()
        (victim / "keep").write_text("precious\n")
    else:
        victim.write_text("precious\n")
    (run_dir / name).parent.mkdir(exist_ok=True)
    (run_dir / name).symlink_to(victim)
    state = (lambda: (victim / "keep").read_bytes()) if victim.is_dir() else victim.read_bytes
    held = state()
    proc = _resume(run_dir, "--runtime", "subprocess", "--retry-errors")
    assert state() == held, "metrale wrote through a link of the run directory"
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "symbolic link" in line and name in line and "Traceback" not in proc.stderr
