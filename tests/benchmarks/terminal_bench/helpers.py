"""Writing Harbor task directories in tests: a small task of our own (not one shipped), with
a right or a wrong solution, or broken in one named way."""

from __future__ import annotations

from pathlib import Path

TOML = """version = "1.0"

[metadata]
author = "tests"

[agent]
timeout_sec = {agent_timeout}

[verifier]
timeout_sec = {verifier_timeout}

[environment]
cpus = 1
memory = "512M"
allow_internet = false
"""

DOCKERFILE = """FROM debian:bookworm
RUN mkdir -p /srv/puzzle && printf '3 4 5\\n10 20 30\\n' > /srv/puzzle/numbers.txt
WORKDIR /srv/puzzle
"""

INSTRUCTION = "Write the sum of each line of numbers.txt to sums.txt, one a line.\n"
RIGHT = "#!/bin/bash\nawk '{s=0; for (i=1;i<=NF;i++) s+=$i; print s}' numbers.txt > sums.txt\n"
WRONG = "#!/bin/bash\necho 12 > sums.txt\n"
TEST = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /srv/puzzle/sums.txt 2>/dev/null)" = "$(printf '12\\n60')" ]; then
    echo 1 > /logs/verifier/reward.txt; echo PASS
else
    echo 0 > /logs/verifier/reward.txt; echo FAIL
fi
"""


def write_task(
    root: Path,
    name: str = "line-sums",
    *,
    solution: str = RIGHT,
    test: str = TEST,
    dockerfile: str = DOCKERFILE,
    agent_timeout: float = 60.0,
    verifier_timeout: float = 60.0,
) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text(INSTRUCTION)
    (task / "task.toml").write_text(
        TOML.format(agent_timeout=agent_timeout, verifier_timeout=verifier_timeout)
    )
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text(test)
    (task / "solution" / "solve.sh").write_text(solution)
    return task


BROKEN_BUILD = DOCKERFILE + "RUN echo 'metrale-test: this build step fails' >&2 && false\n"


def write_dataset(root: Path) -> Path:
    """A dataset with known outcomes: `sums-right` passes every attempt, `sums-wrong` fails
    every one, `build-fails` fails its image build, `wants-gpu` asks for a GPU (refused),
    `no-toml` has no task.toml (skipped), and a file at the top is not a task."""
    data = root / "dataset"
    data.mkdir()
    write_task(data, "sums-right")
    write_task(data, "sums-wrong", solution=WRONG)
    write_task(data, "build-fails", dockerfile=BROKEN_BUILD)
    gpu = write_task(data, "wants-gpu")
    (gpu / "task.toml").write_text((gpu / "task.toml").read_text() + "gpus = 1\n")
    bare = write_task(data, "no-toml")
    (bare / "task.toml").unlink()
    (data / "README.md").write_text("not a task\n")
    return data
