"""terminal_bench on docker asks the engine whether it answers once per run, not once for each
layer that makes sure of it (the CLI, the benchmark's runtime choice, the rollout engine).

The engine here is a stand-in `docker` that notes every call: it answers `version` and has
the base image, and fails everything else (the build, the sandbox: each rollout fails).
The shared container engine is never touched."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli

FAKE_DOCKER = """#!/bin/sh
echo "$@" >> {calls}
case "$1 $2" in
  "version "*) echo 27.0.0; exit 0 ;;
  "image inspect")
    for last; do :; done
    case "$last" in metrale-task/*) echo "no such image" >&2; exit 1 ;; esac
    case "$*" in *--format*) echo sha256:base ;; *) echo '[{{"Id": "sha256:base"}}]' ;; esac
    exit 0 ;;
esac
echo "not in this test: $1" >&2
exit 1
"""


def test_one_engine_probe_per_run(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER.format(calls=calls))
    docker.chmod(0o755)
    out = tmp_path / "run"
    proc = run_cli(
        ["run", "terminal_bench", "-p", "task=fix-git", "-p", "agent=oracle", "--rollouts", "2",
         "--runtime", "docker", "--docker-cli", str(docker), "--out", str(out)],
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr  # every rollout failed: the build cannot run
    records = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["error"] for r in records)
    probes = [line for line in calls.read_text().splitlines() if line.startswith("version")]
    assert len(probes) == 1, calls.read_text()
