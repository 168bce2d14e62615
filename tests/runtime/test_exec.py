"""`metrale exec` and the runtime flags, through the real command line."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tests.runtime.conftest import HAVE_BWRAP

RUNTIMES = [
    "subprocess",
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAVE_BWRAP, reason="bwrap not installed")),
]


@pytest.mark.parametrize("name", RUNTIMES)
def test_exec_prints_output_and_returns_the_exit_code(name: str, marker: str) -> None:
    proc = run_cli(
        ["exec", "--runtime", name, "--", "sh", "-c", f"echo out-{marker}; echo err >&2; exit 7"],
        timeout=60,
    )
    assert proc.returncode == 7
    assert proc.stdout == f"out-{marker}\n"
    assert proc.stderr == "err\n"


@pytest.mark.parametrize("name", RUNTIMES)
def test_exec_times_out_with_124(name: str, marker: str) -> None:
    argv = ["exec", "--runtime", name, "--timeout", "0.5", "--", "sleep", marker]
    proc = run_cli(argv, timeout=60)
    assert proc.returncode == 124


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["exec", "--", "true"], "needs --runtime"),
        (
            ["exec", "--runtime", "nope", "--", "true"],
            "accepted: bwrap, docker, modal, prime, ray, subprocess",
        ),
        (["exec", "--runtime", "subprocess"], "needs a command"),
        (["exec", "--runtime", "subprocess", "--image", "x", "--", "true"], "do not apply"),
        (["exec", "--runtime", "bwrap", "--ro-bind", "/nonexistent", "--", "true"], "bind source"),
        (["run", "gsm8k", "--image", "x", "--target", "http://127.0.0.1:9"], "need --runtime"),
        (["exec", "--runtime", "ray", "--ray-address", "127.0.0.1:1", "--", "true"], "ray"),
    ],
)
def test_bad_runtime_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = run_cli(args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
