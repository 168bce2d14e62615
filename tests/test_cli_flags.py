"""The command line's flags: generated from the benchmarks' ParamSpecs, every run-wide flag
honoured or refused before any work, and `run` and `matrix` taking the same flags the same way
(issue 9 items 6 and 8, issue 13 item 5). Every command runs as a real `metrale` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli


def assert_usage_error(args: list[str], needle: str, cwd: Path) -> None:
    """Exit 2, one line naming the problem, no traceback, and nothing started or written."""
    proc = run_cli(args, cwd=cwd, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert list(cwd.iterdir()) == [], "a refused command wrote something"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        # a run-wide flag the benchmark does not honour (Benchmark.options), on run and matrix
        (["run", "serve", "--runtime", "bwrap"], "--runtime does not apply to serve"),
        (["matrix", "serve", "--runtime", "bwrap"], "--runtime does not apply to serve"),
        (["run", "serve", "--retries", "5"], "--retries does not apply to serve; the run-wide "
         "flags it honours: --request-timeout, --no-stream, --max-response-kb"),
        (["matrix", "serve", "--retries", "5"], "--retries does not apply to serve"),
        (["run", "serve", "--retries-runtime", "3"], "--retries-runtime does not apply to serve"),
        (["matrix", "serve", "--memory-mb", "64"], "--memory-mb does not apply to serve"),
        (["run", "serve", "--image", "x"], "--image does not apply to serve"),
        (["run", "serve", "--no-preflight", "--runtime", "none", "--retries", "1"],
         "--retries does not apply to serve"),
        # --runtime none: accepted by both, or (a benchmark that needs a sandbox) by neither
        (["run", "agentic-webserver", "--runtime", "none"],
         "agentic_webserver needs a runtime, so --runtime none does not apply"),
        (["matrix", "agentic-webserver", "--runtime", "none"],
         "agentic_webserver needs a runtime, so --runtime none does not apply"),
        (["run", "gsm8k", "--runtime", "none", "--memory-mb", "64"], "--runtime none takes"),
        (["matrix", "gsm8k", "--memory-mb", "64"], "need a runtime to shape"),
        # a parameter flag without its value says so, and what it accepts
        (["run", "gsm8k", "--rollouts"], "--rollouts needs a value; accepted: int in [1..1000000]"),
        (["matrix", "gsm8k", "--rollouts"], "--rollouts needs a value; accepted: int in"),
        (["run", "gsm8k", "--rollouts", "3", "--rollouts", "4"], "--rollouts is given 2 times"),
        (["run", "gsm8k", "--bogus", "1"], "unknown parameter 'bogus'; valid parameters: "),
        (["matrix", "gsm8k", "--bogus", "1"], "unknown parameter 'bogus'; valid parameters: "),
        # issue 9's bad input for a sweep: an undeclared parameter, a value out of bounds, a
        # parameter that is not a sweep axis given several values
        (["matrix", "gsm8k", "-p", "no_such=1,2"],
         "gsm8k has no parameter 'no_such'; its parameters: rollouts, max_concurrent"),
        (["matrix", "gsm8k", "--max-tokens", "0"], "max_tokens=0 is below its minimum"),
        (["matrix", "gsm8k", "--temperature", "0.5,3"], "temperature=3 is above its maximum"),
        (["matrix", "gsm8k", "--max-concurrent", "0,4"], "'0' is not a concurrency cap"),
        (["matrix", "agentic_webserver", "--build-timeout-s", "10,20"],
         "cannot sweep 'build_timeout_s'; its sweep axes: rollouts, max_concurrent"),
        (["matrix", "serve", "--warmup", "1,2"], "serve cannot sweep 'warmup'"),
        (["run", "agentic-webserver", "--rollouts", "0"], "rollouts=0 is below its minimum"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_exit_2_before_any_work(
    args: list[str], needle: str, tmp_path: Path
) -> None:
    assert_usage_error(args, needle, tmp_path)


def test_run_bench_help_lists_its_parameters_types_bounds_defaults() -> None:
    generic = run_cli(["run", "--help"])
    gsm = run_cli(["run", "gsm8k", "--help"])
    assert gsm.returncode == 0 and generic.returncode == 0
    assert gsm.stdout != generic.stdout
    text = " ".join(gsm.stdout.split())  # argparse wraps help text
    assert "gsm8k parameters:" in text
    assert "--max-concurrent N rollouts in flight at once; none = unbounded [int in [1..] or " \
        "none; default none]" in text  # fmt: skip
    assert "--system-prompt TEXT" in text and "--rollouts N" in text
    assert "[int in [1..1000000]; default 64]" in text
    assert "sweep axis" not in text  # run takes one value each
    assert "metrale run gsm8k" in gsm.stdout.splitlines()[0]
    serve = " ".join(run_cli(["run", "serve", "--help"]).stdout.split())
    assert "--ignore-eos [BOOL]" in serve and "--no-ignore-eos for false" in serve
    agent = " ".join(run_cli(["run", "agentic-webserver", "--help"]).stdout.split())
    assert "agentic_webserver parameters:" in agent and "--max-turns N" in agent


def test_matrix_bench_help_marks_its_sweep_axes() -> None:
    proc = run_cli(["matrix", "serve", "--help"])
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--concurrency N[,...]" in text and "default 8; sweep axis]" in text
    assert "--warmup N " in text  # not an axis: one value
    for flag in ("--retries", "--request-timeout", "--no-stream", "--runtime LIST",
                 "--memory-mb", "--retries-runtime"):  # fmt: skip
        assert flag in text, flag


def test_top_level_help_describes_the_tool() -> None:
    proc = run_cli(["--help"])
    assert proc.returncode == 0
    assert "measures LLM endpoints" in proc.stdout
    assert "examples:" in proc.stdout and "metrale matrix gsm8k" in proc.stdout
    for command in ("run", "list", "matrix", "report", "plot", "compare", "sim", "exec"):
        assert f"    {command} " in proc.stdout, command


def test_top_level_help_names_every_installed_benchmark() -> None:
    """The epilog comes from the entry points, so a benchmark added later is in it."""
    from importlib.metadata import entry_points

    installed = {ep.name for ep in entry_points(group="metrale.benchmarks")}
    assert {"gsm8k", "serve", "agentic_webserver", "terminal_bench"} <= installed
    proc = run_cli(["--help"])
    line = next(x for x in proc.stdout.splitlines() if x.startswith("benchmarks:"))
    assert set(line.removeprefix("benchmarks:").split(";")[0].replace(",", " ").split()) == (
        installed
    )


@pytest.mark.parametrize("argv", [["run", "gsm8k", "--help"], ["run", "gsm8k", "--rollouts", "0"]])
def test_a_run_imports_only_the_benchmark_it_runs(argv: list[str]) -> None:
    """Naming the benchmark on the command line loads its module and no other's (the others
    cost start-up: serve's HTTP client alone was ~80 ms)."""
    code = (
        "import sys\n"
        "from metrale.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted({m.split('.')[2] for m in sys.modules\n"
        "              if m.startswith('metrale.benchmarks.')}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "['gsm8k']"


def test_list_aligns_its_columns() -> None:
    proc = run_cli(["list"])
    assert proc.returncode == 0
    rows = [line for line in proc.stdout.splitlines() if line.startswith("  --")]
    assert len(rows) > 20
    # the type column starts at one offset on every row, across every benchmark's block
    starts = {row.index(row.split()[1], len(row.split()[0]) + 2) for row in rows}
    assert len(starts) == 1, starts
    # and so does the default column, after the widest type of all
    (type_at,) = starts
    type_end = max(row.index("  ", type_at) for row in rows)
    defaults = {len(row) - len(row[type_end:].lstrip()) for row in rows}
    assert len(defaults) == 1, defaults
    listed = json.loads(run_cli(["list", "--json"]).stdout)
    serve = next(b for b in listed if b["id"] == "serve")
    assert "concurrency" in serve["sweep_axes"] and "retries" not in serve["options"]


def _run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


#: the same flags, given to run and to matrix: client, runtime and benchmark parameter flags
SHARED_FLAGS = [
    "--rollouts", "3", "--max-tokens", "8", "--temperature", "0.5", "--retries", "0",
    "--request-timeout", "30", "--no-stream", "--max-response-kb", "64",
    "--runtime", "subprocess", "--retries-runtime", "1", "--memory-mb", "4096",
    "--no-preflight",
]  # fmt: skip


def test_run_and_matrix_accept_the_same_flags_the_same_way(sim, tmp_path: Path) -> None:
    run = run_cli(["run", "gsm8k", "--target", sim.url, *SHARED_FLAGS, "--out",
                   str(tmp_path / "run")])  # fmt: skip
    assert run.returncode == 0, run.stderr
    mx = run_cli(["matrix", "gsm8k", "--target", sim.url, *SHARED_FLAGS,
                  "--max-concurrent", "none,2", "--out", str(tmp_path / "sweep")])  # fmt: skip
    assert mx.returncode == 0, mx.stderr
    cells = sorted(p.stem for p in (tmp_path / "sweep").glob("*.json"))
    assert cells == ["subprocess-r3", "subprocess-r3-c2"]
    expected_client = {"request_timeout_s": 30.0, "retries": 0, "stream": False,
                       "max_response_bytes": 64 * 1024}  # fmt: skip
    for run_dir in (tmp_path / "run", *(tmp_path / "sweep" / "runs" / c for c in cells)):
        info = _run_json(run_dir)
        assert {k: info["client"][k] for k in expected_client} == expected_client, run_dir
        assert info["runtime"]["type"] == "subprocess", run_dir
        assert info["runtime"]["limits"]["memory_mb"] == 4096, run_dir
        assert info["params"]["max_tokens"] == 8 and info["params"]["temperature"] == 0.5
        assert info["params"]["rollouts"] == 3
        records = (run_dir / "rollouts.jsonl").read_text().splitlines()
        assert len(records) == 3
        assert all(json.loads(r)["runtime"] == "subprocess" for r in records)


def test_runtime_none_is_in_process_on_both(sim, tmp_path: Path) -> None:
    base = ["gsm8k", "--target", sim.url, "--rollouts", "2", "--runtime", "none",
            "--no-preflight"]  # fmt: skip
    run = run_cli(["run", *base, "--out", str(tmp_path / "run")])
    assert run.returncode == 0, run.stderr
    assert _run_json(tmp_path / "run")["runtime"] is None
    mx = run_cli(["matrix", *base, "--out", str(tmp_path / "sweep")])
    assert mx.returncode == 0, mx.stderr
    cell = json.loads((tmp_path / "sweep" / "none-r2.json").read_text())
    assert cell["runtime"] == "none" and cell.get("runtime_config") is None


def test_matrix_keeps_a_str_parameter_whole_and_a_bool_may_be_a_bare_flag(
    sim, tmp_path: Path
) -> None:
    """serve's --slo is not an axis: its commas are its own, not a sweep; `--no-ignore-eos`
    is false. --concurrency is an axis: its comma list sweeps it."""
    proc = run_cli([
        "matrix", "serve", "--target", sim.url, "--concurrency", "1,2", "--requests", "4",
        "--slo", "ttft_ms=2000,tpot_ms=500", "--no-ignore-eos", "--no-preflight",
        "--out", str(tmp_path),
    ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cells = sorted(p.stem for p in tmp_path.glob("*.json"))
    assert cells == ["concurrency=1", "concurrency=2"]
    for name in cells:
        params = _run_json(tmp_path / "runs" / name)["params"]
        assert params["slo"] == "ttft_ms=2000,tpot_ms=500" and params["ignore_eos"] is False


# --------------------------------------------------------------------------- needs_model False

#: A benchmark that calls no model with agent=oracle (as terminal_bench's oracle agent does),
#: registered as any third-party benchmark is: an entry point of an installed distribution
#: (a dist-info directory on the `metrale` process's path).
FAKE_BENCH = """
from metrale.plugin import Descriptor, ParamSpec
from metrale.rollout import RolloutBenchmark


class Task:
    async def setup(self, ctx):
        pass

    async def generate(self, ctx):
        assert ctx.client is None, "an oracle rollout got a chat client"

    async def score(self, ctx):
        ctx.record.reward = 1.0


class NoModel(RolloutBenchmark):
    descriptor = Descriptor(id="nomodel", name="No model", summary="an oracle")
    default_rollouts = 2

    def extra_parameters(self):
        return [ParamSpec(name="agent", type="str", default="model",
                          choices=["model", "oracle"], help="who acts")]

    def needs_model(self):
        return self.values.get("agent") != "oracle"

    def make_task(self, index):
        return Task()
"""


@pytest.fixture
def fake_cli(tmp_path: Path):  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    (site / "nomodel_bench-0.1.dist-info").mkdir(parents=True)
    (site / "nomodel_bench.py").write_text(textwrap.dedent(FAKE_BENCH))
    info = site / "nomodel_bench-0.1.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nomodel-bench\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[metrale.benchmarks]\nnomodel = nomodel_bench:NoModel\n"
    )
    import subprocess

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        path = [str(site), str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        return subprocess.run(
            [sys.executable, "-m", "metrale", *args], capture_output=True, text=True,
            timeout=120, cwd=tmp_path, env=env,
        )  # fmt: skip

    return run


def test_a_configuration_that_calls_no_model_opens_no_target(fake_cli, tmp_path: Path) -> None:
    proc = fake_cli("run", "nomodel", "--agent", "oracle", "--rollouts", "3", "--out", "run")
    assert proc.returncode == 0, proc.stderr
    assert "embedded" not in proc.stderr and "[preflight]" not in proc.stderr
    info = _run_json(tmp_path / "run")
    assert info["target"] == "" and info["model"] == "" and info["preflight"] is None
    records = [json.loads(r) for r in (tmp_path / "run" / "rollouts.jsonl").read_text().split()]
    assert [r["reward"] for r in records] == [1.0, 1.0, 1.0]
    sweep = fake_cli("matrix", "nomodel", "--agent", "oracle", "--rollouts", "1,2", "--out", "mx")
    assert sweep.returncode == 0, sweep.stderr
    cells = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "mx").glob("*.json")}
    assert sorted(cells) == ["none-r1", "none-r2"]
    assert all(c["status"] == "completed" and c["target"] == "" for c in cells.values())


@pytest.mark.parametrize("command", ["run", "matrix"])
def test_target_flags_are_refused_when_no_model_is_called(fake_cli, command: str) -> None:
    for flag in (["--target", "http://127.0.0.1:9"], ["--retries", "1"], ["--no-stream"]):
        proc = fake_cli(command, "nomodel", "--agent", "oracle", *flag)
        assert proc.returncode == 2, proc.stderr
        assert f"{flag[0]} does not apply: nomodel as configured calls no model" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    # with a model to call, the target is probed (and here, refused as unreachable)
    proc = fake_cli(command, "nomodel", "--agent", "model", "--target", "http://127.0.0.1:9")
    assert proc.returncode == 2 and "connection refused" in proc.stderr


def test_list_names_every_installed_runtime_with_its_capabilities() -> None:
    from metrale.runtime.registry import config_class, runtime_names

    proc = run_cli(["list"])
    assert proc.returncode == 0
    tail = proc.stdout.split("runtimes (--runtime NAME)", 1)[1].splitlines()[1:]
    listed = {line.split()[0]: line for line in tail if line.startswith("  ")}
    assert set(listed) == set(runtime_names()) >= {"subprocess", "bwrap", "docker", "ray"}
    for name, line in listed.items():
        for capability in config_class(name).capabilities:
            assert capability.value in line, (name, capability)


def test_a_run_that_gives_no_runtimes_own_flag_loads_no_runtime_module() -> None:
    """Each runtime's own flags come from its config class, so building them imports every
    runtime's module: only a command line that may use them (help, a `--<runtime>-` token)
    pays for it, when they are built for the parse and when the given ones are read after it."""
    code = (
        "import sys\n"
        "from metrale.cli import main\n"
        "main(['run', 'gsm8k', '--rollouts', '0'])\n"
        # past the flag checks to the target's probe (refused): the flags were read again
        "main(['run', 'gsm8k', '--target', 'http://127.0.0.1:9'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('metrale.runtime.')))\n"
        "main(['run', 'gsm8k', '--docker-cli', 'x', '--rollouts', '0'])\n"
        "print('metrale.runtime.docker' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    loaded, docker = proc.stdout.strip().splitlines()[-2:]
    assert loaded == "['metrale.runtime.base', 'metrale.runtime.registry']"
    assert docker == "True"  # `--docker-cli` was parsed as docker's flag, not unknown
    assert "--docker-cli shapes the docker runtime" not in proc.stderr
