"""The benchmark end to end through `metrale run`, against `metrale sim --replay` trajectories.

The good trajectory really builds an Axum server in the bwrap sandbox (offline, from the warm
cache), and the scorer builds and curls it again in a fresh sandbox.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from metrale.benchmarks.agentic_webserver.directions import CHECKS
from metrale.benchmarks.agentic_webserver.warm import WarmCache
from tests.conftest import run_cli, start_sim

pytestmark = pytest.mark.slow
REPLAYS = resources.files("metrale.benchmarks.agentic_webserver").joinpath("replays")


def run_replay(name: str, out: Path, *params: str) -> tuple[int, dict[str, Any], str]:
    with start_sim("--replay", str(REPLAYS.joinpath(f"{name}.jsonl"))) as sim:
        done = run_cli(
            ["run", "agentic_webserver", "--target", sim.url, "--out", str(out), "--json",
             "--no-preflight", *params],
            timeout=600,
        )  # fmt: skip
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def test_good_trajectory_builds_a_real_server(warm_cargo: WarmCache, tmp_path: Path) -> None:
    code, outcome, stderr = run_replay("good", tmp_path / "run", "--iterations", "1")
    result = outcome["result"]
    m = result["metrics"]
    assert code == 0, stderr
    assert m["webserver_ok"] == 1 and m["followed_directions"] == 1
    assert all(m[f"steps_{name}"] == 1 for name in CHECKS)
    assert m["sum_turns"] == 8 and m["sum_tool_calls"] == 7 and m["max_iter_turns"] == 8
    assert m["sum_hit_turn_cap"] == 0 and m["sum_unparsed_call_turns"] == 0
    assert m["s_per_turn"] > 0 and m["decode_tps"] > 0
    assert m["sum_wall_s"] >= m["sum_agent_wall_s"] > 0
    assert "run 0: webserver_ok · 6/6 steps" in stderr
    assert "executes model-authored shell commands in the bwrap sandbox" in stderr
    assert result["verdict"]["checks"][0]["passed"]
    # evidence: the agent's project stays, the copied cargo target dir does not
    sandbox = tmp_path / "run" / "sandboxes" / "0"
    assert "async fn main" in (sandbox / "work" / "src" / "main.rs").read_text()
    assert not (sandbox / "target").exists()
    transcript = [json.loads(x) for x in (tmp_path / "run/transcripts/0.jsonl").open()]
    assert transcript[1]["content"].startswith("Please create a pure rust Axum project")
    record = json.loads((tmp_path / "run/rollouts.jsonl").read_text())
    assert record["metrics"]["webserver_ok"] is True and record["turns"] == 8


def test_foreground_server_times_out_and_is_noted(warm_cargo: WarmCache, tmp_path: Path) -> None:
    code, outcome, _ = run_replay("foreground_hang", tmp_path / "run", "--command-timeout-s", "6")
    result = outcome["result"]
    m = result["metrics"]
    assert code == 1
    note = result["table"]["rows"][0][-1]
    assert "1 command(s) timed out" in note and "missed: tests_passed" in note
    # the code itself is right: the scorer's build and curl succeed
    assert m["webserver_ok"] == 1 and m["followed_directions"] == 0
    transcript = (tmp_path / "run/transcripts/0.jsonl").read_text()
    assert "timed out after 6 s" in transcript
    assert "FAIL failed_iterations" in " ".join(_verdict_lines(result))


def test_unparseable_calls_are_counted(warm_cargo: WarmCache, tmp_path: Path) -> None:
    code, outcome, _ = run_replay("unparsed_call", tmp_path / "run")
    m = outcome["result"]["metrics"]
    assert code == 1
    assert m["sum_unparsed_call_turns"] == 2 and m["sum_tool_calls"] == 0
    assert m["webserver_ok"] == 0 and m["sum_turns"] == 3
    assert "no Cargo.toml" in outcome["result"]["table"]["rows"][0][-1]


def test_turn_cap_is_hit_and_budgets_name_each_failure(
    warm_cargo: WarmCache, tmp_path: Path
) -> None:
    code, outcome, stderr = run_replay(
        "turn_cap", tmp_path / "run", "--max-turns", "3", "--iterations", "2",
        "--wall-budget-s", "0.001", "--s-per-turn-budget", "0.000001",
    )  # fmt: skip
    result = outcome["result"]
    m = result["metrics"]
    assert code == 1
    assert m["sum_hit_turn_cap"] == 2 and m["max_iter_turns"] == 3 and m["sum_turns"] == 6
    assert "hit the turn cap (3)" in result["table"]["rows"][1][-1]
    failed = {c["metric"] for c in result["verdict"]["checks"] if not c["passed"]}
    assert failed == {"failed_iterations", "sum_wall_s", "s_per_turn"}
    assert "run 1: FAILED · 0/6 steps" in stderr


def test_sandbox_is_wiped_when_its_index_runs_again(warm_cargo: WarmCache, tmp_path: Path) -> None:
    stale = tmp_path / "run" / "sandboxes" / "0" / "work" / "stale.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier run")
    run_replay("turn_cap", tmp_path / "run", "--max-turns", "1")
    assert not stale.exists() and stale.parent.is_dir()


def test_missing_cargo_is_one_clear_line(sim: Any, tmp_path: Path) -> None:
    if "cargo" in os.listdir("/usr/bin"):
        pytest.skip("cargo is installed system-wide")
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = run_cli(
        ["run", "agentic_webserver", "--target", sim.url, "--out", str(tmp_path / "r"),
         "--no-preflight"],
        env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "needs Rust's cargo" in done.stderr and "Traceback" not in done.stderr


def _verdict_lines(result: dict[str, Any]) -> list[str]:
    return [
        f"{'PASS' if c['passed'] else 'FAIL'} {c['metric']}" for c in result["verdict"]["checks"]
    ]


def test_the_runners_runtime_is_the_one_used_and_recorded(
    warm_cargo: WarmCache, tmp_path: Path
) -> None:
    """A matrix cell hands the runner a runtime config; the benchmark runs in it, and run.json
    records that runtime (not a default it did not use)."""
    import asyncio

    from metrale import runner
    from metrale.endpoint.client import Target
    from metrale.runtime.configs import runtime_config

    with start_sim("--replay", str(REPLAYS.joinpath("turn_cap.jsonl"))) as sim:
        request = runner.RunRequest(
            benchmark="agentic_webserver",
            params={"max_turns": 1},
            target=Target(base_url=sim.url, model=sim.model),
            runtime=runtime_config("subprocess"),
            out=tmp_path / "run",
            preflight=False,
            progress=None,
        )
        outcome = asyncio.run(runner.run(request))
    record = json.loads((tmp_path / "run/rollouts.jsonl").read_text())
    assert record["runtime"] == "subprocess" and outcome.result.metrics["sum_turns"] == 1
    info = json.loads((tmp_path / "run/run.json").read_text())
    assert info["runtime"]["type"] == "subprocess" and "runtime" not in info["params"]
    assert any("in the subprocess runtime" in line.message for line in outcome.result.logs)


def test_a_crate_the_cache_lacks_is_a_clear_build_error(
    warm_cargo: WarmCache, tmp_path: Path
) -> None:
    """Offline, a dependency the warm step did not fetch fails fast with cargo's own words."""
    manifest = (
        '[package]\nname = "pingpong"\nversion = "0.1.0"\nedition = "2021"\n\n'
        '[dependencies]\nreqwest = "0.12"\n'
    )
    turns = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "cargo init --name pingpong"}}]},
        {"tool_calls": [{"name": "bash", "arguments": {
            "command": f"cat > Cargo.toml <<'EOF'\n{manifest}EOF"}}]},
        {"content": "Done."},
    ]  # fmt: skip
    replay = tmp_path / "reqwest.jsonl"
    replay.write_text("".join(json.dumps(t) + "\n" for t in turns))
    with start_sim("--replay", str(replay)) as sim:
        done = run_cli(
            ["run", "agentic_webserver", "--target", sim.url, "--out", str(tmp_path / "run"),
             "--json", "--no-preflight", "--build-timeout-s", "120"],
            timeout=300,
        )  # fmt: skip
    result = json.loads(done.stdout)["result"]
    note = result["table"]["rows"][0][-1]
    assert done.returncode == 1
    assert "build failed" in note and "reqwest" in note, note
    assert result["metrics"]["webserver_ok"] == 0
