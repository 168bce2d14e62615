"""Issue 12 item 13: a user's bad file, path or value is one line and exit 2, never a
traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.helpers import cli


def _one_line_usage_error(args: list[str], needle: str) -> None:
    proc = cli(args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0], proc.stderr


def test_budgets_path_that_is_a_directory_or_not_utf8(tmp_path: Path, sim) -> None:
    binary = tmp_path / "BENCH.toml"
    binary.write_bytes(b"[gsm8k]\nreward_min = 0.5 # \xff\xfe\n")
    for path, needle in [(tmp_path, "is a directory"), (binary, "not UTF-8")]:
        _one_line_usage_error(
            ["run", "gsm8k", "--target", sim.url, "--budgets", str(path), "--out",
             str(tmp_path / "run")], needle,
        )  # fmt: skip
        assert not (tmp_path / "run").exists()


def test_non_writable_out(tmp_path: Path, sim) -> None:
    # /proc/1/fdinfo is a directory no one may create files in, root included
    _one_line_usage_error(
        ["run", "gsm8k", "--target", sim.url, "--no-preflight", "--out", "/proc/1/fdinfo"],
        "/proc/1/fdinfo",
    )
    below_a_file = tmp_path / "file"
    below_a_file.write_text("x")
    _one_line_usage_error(
        ["run", "gsm8k", "--target", sim.url, "--out", str(below_a_file / "run")], "run directory"
    )


def test_non_utf8_prompts_and_replay_files(tmp_path: Path, sim) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')
    _one_line_usage_error(
        ["run", "serve", "--target", sim.url, "--no-preflight", "--prompts", str(bad),
         "--out", str(tmp_path / "run")], "not UTF-8",
    )  # fmt: skip
    _one_line_usage_error(["sim", "--port", "0", "--replay", str(bad)], "not UTF-8")
    _one_line_usage_error(["sim", "--port", "0", "--replay", str(tmp_path)], "is a directory")


def test_messages_that_are_not_messages(tmp_path: Path, sim) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"messages": [1, 2]}\n')
    for api in ("completions", "chat"):
        _one_line_usage_error(
            ["run", "serve", "--target", sim.url, "--no-preflight", "--prompts", str(prompts),
             "--api", api, "--out", str(tmp_path / f"run-{api}")], "line 1",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["sim", "--port", "99999"], "--port: '99999': accepted: an integer 0..65535"),
        (["sim", "--port", "-1"], "--port"),
        (["run", "gsm8k", "--target", "http://[::1/v1"], "not a valid URL"),
        (["run", "gsm8k", "--target", "http://127.0.0.1:99999/v1"], "not a valid URL"),
        (["run", "--resume", "/nonexistent-run-dir"], "not a directory"),
        (["run", "gsm8k", "--retry-errors"], "--retry-errors needs --resume"),
        (["run"], "needs a benchmark"),
    ],
)
def test_bad_values(args: list[str], needle: str) -> None:
    _one_line_usage_error(args, needle)
