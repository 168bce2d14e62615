"""Issue 12 item 8: a low fd limit, a full disk and a huge rollout count keep what finished."""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale.rollout import RolloutContext, RolloutPlan, run_rollouts
from tests.conftest import start_sim
from tests.faults.helpers import lines


def _limited(n: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def test_1200_unbounded_rollouts_at_ulimit_1024_complete(tmp_path: Path) -> None:
    with start_sim("--ttft", "0.2") as sim:
        proc = subprocess.run(
            [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", sim.url,
             "--no-preflight", "--rollouts", "1200", "--max-tokens", "4",
             "--out", str(tmp_path / "run")],
            capture_output=True, text=True, timeout=180, preexec_fn=_limited(1024),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "file descriptors" in proc.stderr  # the cap is said, once, as a warning
    records = lines(tmp_path / "run" / "rollouts.jsonl")
    assert sorted(r["index"] for r in records) == list(range(1200))
    assert not [r for r in records if r["error"]]


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 200 KiB tmpfs (we are root); unmounted whatever happens."""
    if shutil.which("mount") is None:
        pytest.skip("mount is not available")
    where = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def test_full_disk_stops_cleanly_with_every_earlier_record_intact(tiny_disk: Path) -> None:
    run_dir = tiny_disk / "run"
    with start_sim() as sim:
        proc = subprocess.run(
            [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", sim.url,
             "--no-preflight", "--rollouts", "2000", "--max-concurrent", "4",
             "--max-tokens", "4", "--out", str(run_dir)],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "No space left" in proc.stderr
    raw = (run_dir / "rollouts.jsonl").read_bytes()
    assert raw.endswith(b"\n")  # no torn last line
    records = [json.loads(x) for x in raw.splitlines()]
    assert 10 < len(records) < 2000
    assert len({r["index"] for r in records}) == len(records)


def test_a_million_rollouts_are_not_a_million_tasks() -> None:
    seen: list[int] = []

    class Task:
        async def setup(self, ctx: RolloutContext) -> None:
            seen.append(len(asyncio.all_tasks()))

        async def generate(self, ctx: RolloutContext) -> None:
            await asyncio.sleep(0)

        async def score(self, ctx: RolloutContext) -> None:
            ctx.record.reward = 1.0

    class Enough(Exception):
        pass

    def on_record(record: object) -> None:
        if len(seen) >= 2000:
            raise Enough

    plan = RolloutPlan(benchmark="t", count=1_000_000, max_concurrent=64,
                       make_task=lambda i: Task(), on_record=on_record)  # fmt: skip
    with pytest.raises(Enough):
        asyncio.run(run_rollouts(plan))
    assert max(seen) <= 64 + 2  # the workers, the main task, nothing per rollout
