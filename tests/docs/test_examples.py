"""The worked examples of docs/extending.md, run as a reader would run them.

- the benchmark (`docs/examples/repeat_bench.py`) registered under the `metrale.benchmarks`
  entry-point group by an installed distribution's metadata, then `metrale list`, `metrale run`
  against a real `metrale sim`, and a budget on the metric it declares;
- the runtime (`docs/examples/netless_runtime.py`) put into a copy of the source tree with the
  one-line registration the doc shows, then `metrale exec --runtime netless` and a gsm8k run in
  it.

If the contract these examples are written against changes, these tests fail and the doc is
fixed in the same commit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import start_sim

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
EXTENDING = ROOT / "docs" / "extending.md"


def metrale(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metrale", *args],
        capture_output=True, text=True, timeout=120, env=env, cwd=cwd,
    )  # fmt: skip


def env_with(*paths: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")])
    return env


def doc_block(after: str) -> str:
    """The first fenced block of extending.md after the line containing `after`."""
    text = EXTENDING.read_text(encoding="utf-8")
    rest = text[text.index(after) :]
    match = re.search(r"```[a-z]*\n(.*?)```", rest, re.S)
    assert match, f"no fenced block after {after!r} in extending.md"
    return match.group(1)


@pytest.fixture
def installed_repeat(tmp_path: Path) -> dict[str, str]:
    """The example benchmark installed as a distribution would be: its module importable and
    an entry point in a `.dist-info` directory, with the entry-point text extending.md shows."""
    site = tmp_path / "site"
    info = site / "metrale_repeat-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: metrale-repeat\nVersion: 0.1\n")
    declared = tomllib.loads(doc_block("an entry point** in"))
    group = declared["project"]["entry-points"]["metrale.benchmarks"]
    lines = "".join(f"{name} = {target}\n" for name, target in group.items())
    (info / "entry_points.txt").write_text(f"[metrale.benchmarks]\n{lines}")
    shutil.copy(EXAMPLES / "repeat_bench.py", site / "repeat_bench.py")
    return env_with(site)


def test_the_example_benchmark_is_listed_with_its_parameters_and_axes(
    installed_repeat: dict[str, str], tmp_path: Path
) -> None:
    done = metrale(["list", "--json"], installed_repeat, tmp_path)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    entry = next(b for b in listing if b["id"] == "repeat")
    params = {p["name"] for p in entry["parameters"]}
    assert {"rollouts", "max_concurrent", "word", "max_tokens"} <= params
    assert entry["sweep_axes"] == ["rollouts", "max_concurrent", "word"]


def test_the_example_benchmark_runs_scores_and_reports_its_metric(
    installed_repeat: dict[str, str], tmp_path: Path
) -> None:
    with start_sim("--reply", "hello") as sim:
        out = tmp_path / "run"
        done = metrale(
            ["run", "repeat", "--target", sim.url, "--rollouts", "6", "--quiet", "--out", str(out)],
            installed_repeat, tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "reply_words (words)" in done.stdout
        summary = json.loads((out / "summary.json").read_text())
        assert summary["records"] == 6 and summary["errors"] == 0
        assert summary["reward_mean"] == 1.0
        assert summary["metrics"]["reply_words"] == 1.0
        # the word is a parameter: a reply that is not it scores 0, in a sandbox too
        done = metrale(
            ["run", "repeat", "--target", sim.url, "--rollouts", "3", "--word", "world",
             "--runtime", "subprocess", "--quiet", "--out", str(tmp_path / "other")],
            installed_repeat, tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        other = json.loads((tmp_path / "other" / "summary.json").read_text())
        assert other["reward_mean"] == 0.0 and other["errors"] == 0


def test_a_budget_on_the_new_metric_decides_the_verdict(
    installed_repeat: dict[str, str], tmp_path: Path
) -> None:
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(doc_block("A budget on it"))
    with start_sim("--reply", "hello there friend") as sim:
        done = metrale(
            ["run", "repeat", "--target", sim.url, "--rollouts", "4", "--quiet",
             "--budgets", str(budgets), "--out", str(tmp_path / "run")],
            installed_repeat, tmp_path,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    checks = {c["metric"]: c for c in result["result"]["verdict"]["checks"]}
    assert checks["reply_words"]["value"] == 3.0 and not checks["reply_words"]["passed"]


@pytest.fixture
def tree_with_netless(tmp_path: Path) -> Path:
    """A copy of the source tree with the runtime added as extending.md says: the module at
    src/metrale/runtime/netless.py and the entry-point line, installed beside it as a
    distribution's metadata (what `pip install -e .` would write)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(EXAMPLES / "netless_runtime.py", src / "metrale" / "runtime" / "netless.py")
    declared = tomllib.loads(doc_block("The registration**: one entry-point line"))
    group = declared["project"]["entry-points"]["metrale.runtimes"]
    info = src / "metrale_netless-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: metrale-netless\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in group.items())
    (info / "entry_points.txt").write_text(f"[metrale.runtimes]\n{lines}")
    return src


def test_the_example_runtime_runs_a_command_with_no_network(
    tree_with_netless: Path, tmp_path: Path
) -> None:
    env = env_with(tree_with_netless)
    done = metrale(
        ["exec", "--runtime", "netless", "--", "sh", "-c", "cat /proc/net/dev | wc -l; pwd"],
        env, tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines, workdir = done.stdout.split()
    assert lines == "3"  # two header lines and loopback: no other interface
    assert not Path(workdir).exists()  # stop() removed the workdir


def test_a_rollout_benchmark_runs_in_the_example_runtime(
    tree_with_netless: Path, tmp_path: Path
) -> None:
    env = env_with(tree_with_netless)
    with start_sim() as sim:
        out = tmp_path / "run"
        done = metrale(
            ["run", "gsm8k", "--target", sim.url, "--rollouts", "4", "--runtime", "netless",
             "--quiet", "--out", str(out)],
            env, tmp_path,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["runtime"] for r in records] == ["netless"] * 4
    assert all(r["error"] is None and r["metrics"]["grader"] == "awk" for r in records)
    assert json.loads((out / "run.json").read_text())["runtime"]["type"] == "netless"
