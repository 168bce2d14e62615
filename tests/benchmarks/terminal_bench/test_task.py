"""Reading Harbor task directories: what is accepted, and one UsageError line (file and
problem) for each way a task can be broken, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale.benchmarks.terminal_bench.task import (
    load_task,
    parse_dockerfile,
    shipped_task_names,
)
from metrale.errors import UsageError
from tests.benchmarks.terminal_bench.helpers import write_task


def test_a_task_dir_is_read_with_its_limits_and_timeouts(tmp_path: Path) -> None:
    task = load_task(str(write_task(tmp_path, agent_timeout=45, verifier_timeout=30)))
    assert task.name == "line-sums"
    assert task.instruction.startswith("Write the sum")
    assert task.version == "1.0"
    assert task.metadata == {"author": "tests"}
    assert (task.agent_timeout_s, task.verifier_timeout_s) == (45.0, 30.0)
    assert task.environment.memory_mb == 512
    assert task.environment.cpus == 1.0
    assert task.environment.allow_internet is False
    assert task.dockerfile is not None and task.dockerfile.bases == ("debian:bookworm",)
    assert task.dockerfile.workdir == "/srv/puzzle"
    assert task.has_solution


def test_a_task_toml_with_a_byte_order_mark_or_crlf_lines_reads_as_without(
    tmp_path: Path,
) -> None:
    """As editors on Windows write them (a published collection has such files)."""
    path = write_task(tmp_path, agent_timeout=45)
    toml = path / "task.toml"
    toml.write_bytes(b"\xef\xbb\xbf" + toml.read_text().replace("\n", "\r\n").encode())
    task = load_task(str(path))
    assert task.agent_timeout_s == 45.0 and task.metadata == {"author": "tests"}


def test_the_three_shipped_tasks_are_found_by_name() -> None:
    assert shipped_task_names() == ["fix-git", "fix-money", "log-summary"]
    task = load_task("fix-git")
    assert task.environment.memory_mb == 1024  # memory = "1G"
    assert task.has_solution and (task.tests_dir / "test.sh").is_file()


@pytest.mark.parametrize(
    ("memory", "mb"),
    [('"2G"', 2048), ('"512M"', 512), ('"1.5GiB"', 1536), ('"2048MB"', 2048), ('"1T"', 1 << 20)],
)
def test_memory_sizes(tmp_path: Path, memory: str, mb: int) -> None:
    path = write_task(tmp_path)
    toml = path / "task.toml"
    toml.write_text(toml.read_text().replace('memory = "512M"', f"memory = {memory}"))
    assert load_task(str(path)).environment.memory_mb == mb


def _broken(tmp_path: Path, how: str) -> Path:
    path = write_task(tmp_path)
    toml = path / "task.toml"
    if how == "no-instruction":
        (path / "instruction.md").unlink()
    elif how == "no-toml":
        toml.unlink()
    elif how == "no-test":
        (path / "tests" / "test.sh").unlink()
    elif how == "bad-toml":
        toml.write_text(toml.read_text() + "\n[agent\ntimeout_sec = 3\n")
    elif how == "bad-timeout":
        toml.write_text(toml.read_text().replace("timeout_sec = 60.0", 'timeout_sec = "soon"', 1))
    elif how == "bad-memory":
        toml.write_text(toml.read_text().replace('"512M"', '"lots"'))
    elif how == "both-memory":
        toml.write_text(toml.read_text().replace('memory = "512M"', 'memory = "1G"\nmemory_mb = 9'))
    elif how == "bad-internet":
        toml.write_text(toml.read_text().replace("allow_internet = false", 'allow_internet = "no"'))
    elif how == "table-not-table":
        toml.write_text('version = "1.0"\nagent = 5\n')
    elif how == "no-dockerfile":
        (path / "environment" / "Dockerfile").unlink()
    elif how == "no-from":
        (path / "environment" / "Dockerfile").write_text("RUN true\n")
    elif how == "empty-instruction":
        (path / "instruction.md").write_text("  \n")
    elif how == "not-utf8":
        (path / "instruction.md").write_bytes(b"\xff\xfe bad")
    return path


@pytest.mark.parametrize(
    ("how", "named", "problem"),
    [
        ("no-instruction", "instruction.md", "missing"),
        ("no-toml", "task.toml", "missing"),
        ("no-test", "tests/test.sh", "missing"),
        ("bad-toml", "task.toml", "not valid TOML"),
        ("bad-timeout", "task.toml", "timeout_sec = 'soon' is not a number; accepted"),
        ("bad-memory", "task.toml", "is not a size"),
        ("both-memory", "task.toml", "both memory and memory_mb"),
        ("bad-internet", "task.toml", "allow_internet must be true or false"),
        ("table-not-table", "task.toml", "[agent] must be a table"),
        ("no-dockerfile", "environment/Dockerfile", "missing"),
        ("no-from", "Dockerfile", "no FROM line"),
        ("empty-instruction", "instruction.md", "empty"),
        ("not-utf8", "instruction.md", "not UTF-8"),
    ],
)
def test_a_broken_task_is_one_line_naming_the_file(
    tmp_path: Path, how: str, named: str, problem: str
) -> None:
    path = _broken(tmp_path, how)
    with pytest.raises(UsageError) as info:
        load_task(str(path))
    message = str(info.value)
    assert "\n" not in message
    assert named in message and problem in message, message


def test_an_unknown_task_name_lists_the_shipped_ones() -> None:
    with pytest.raises(UsageError, match="shipped tasks: fix-git, fix-money, log-summary"):
        load_task("no-such-task")


def test_dockerfile_bases_skip_stages_and_expand_args() -> None:
    text = """# build
ARG BASE=python:3.12
FROM --platform=linux/amd64 ${BASE} AS builder
RUN echo hi \\
    && echo there
FROM debian:bookworm
COPY --from=builder /x /x
WORKDIR /opt
WORKDIR app
FROM builder
"""
    parsed = parse_dockerfile(text)
    assert parsed.bases == ("python:3.12", "debian:bookworm")
    assert parsed.workdir is None  # the last stage (FROM builder) sets none
    assert parse_dockerfile("FROM scratch\nWORKDIR /a\nWORKDIR b\n").workdir == "/a/b"
    assert parse_dockerfile("FROM scratch\n").bases == ()
