"""The refusal in front of the image builder (CVE-2024-1753 in Debian 12's buildah): a task
whose Dockerfile mounts a host or image path into a build step is one line naming the task and
the line, before any work, whatever the spelling; mounts that name no host path still load."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale.benchmarks.terminal_bench.task import load_task
from metrale.errors import UsageError
from tests.benchmarks.terminal_bench.helpers import write_task

HEAD = "FROM debian:bookworm AS link\nRUN ln -s / /hostroot\nFROM debian:bookworm\n"

REFUSED = {
    "stage": "RUN --mount=type=bind,from=link,source=/hostroot,target=/x,rw cat /x/etc/shadow",
    "bind is the default type": "RUN --mount=from=link,source=/hostroot,target=/x true",
    "from an image": "RUN --mount=type=bind,from=metrale/base:bookworm,src=/,target=/x true",
    "context symlink": "RUN --mount=type=bind,source=link,target=/x,rw true",
    "ARG substitution": "ARG T=bind\nRUN --mount=type=${T},from=link,source=/hostroot,target=/x t",
    "ARG in a cache mount": "ARG S=/hostroot\nRUN --mount=type=cache,from=link,src=$S,target=/x t",
    "cache from a stage": "RUN --mount=type=cache,from=link,source=/hostroot,target=/x true",
    "secret": "RUN --mount=type=secret,id=key,target=/x cat /x",
    "ssh": "RUN --mount=type=ssh true",
    "continuation": "RUN --mo\\\n  unt=type=bind,from=link,\\\n  source=/hostroot,target=/x true",
    "comment in a continuation": "RUN \\\n# a comment\n --mount=type=bind,from=link,target=/x true",
    "escape directive": "RUN --mount=type=bind,`\n from=link,source=/hostroot,target=/x true",
    "heredoc": "RUN --mount=type=bind,from=link,source=/hostroot,target=/x <<EOF\ncat /x/a\nEOF",
    "upper case": "run --MOUNT=TYPE=BIND,FROM=link,SOURCE=/hostroot,TARGET=/x true",
    "space separated": "RUN --mount type=bind,from=link,source=/hostroot,target=/x true",
    "quoted": 'RUN --mount="type=bind,from=link,source=/hostroot,target=/x" true',
    "onbuild": "ONBUILD RUN --mount=type=bind,from=link,source=/hostroot,target=/x true",
    "cache id climbing out": "RUN --mount=type=cache,id=../../../../etc,target=/x true",
    "after a continued comment": "# note \\\nRUN --mount=type=bind,from=link,target=/x true",
}

ACCEPTED = {
    "cache": "RUN --mount=type=cache,target=/root/.cache/pip true",
    "cache with id and sharing": "RUN --mount=type=cache,id=apt,sharing=locked,target=/v true",
    "tmpfs": "RUN --mount=type=tmpfs,target=/scratch,size=64m true",
    "no mount": "RUN echo hello && mount --help >/dev/null || true",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_mount_of_a_host_or_image_path_is_refused_naming_task_and_line(
    tmp_path: Path, case: str
) -> None:
    body = REFUSED[case]
    head = ("# escape=`\n" if case == "escape directive" else "") + HEAD
    text = head + body + "\n"
    path = write_task(tmp_path, name="escape-task", dockerfile=text)
    with pytest.raises(UsageError) as info:
        load_task(str(path))
    message = str(info.value)
    assert "\n" not in message
    assert "task escape-task" in message and "Dockerfile line" in message
    assert "type=cache or type=tmpfs" in message
    offset = len(head.splitlines())
    lines = body.splitlines()
    run = next(n for n, ln in enumerate(lines, 1) if ln.upper().startswith(("RUN", "ON")))
    assert f"line {offset + run} " in message


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_mounts_that_name_no_host_path_still_load(tmp_path: Path, case: str) -> None:
    path = write_task(tmp_path, dockerfile=HEAD + ACCEPTED[case] + "\n")
    assert load_task(str(path)).dockerfile is not None


@pytest.mark.parametrize(
    ("lines", "ok"),
    [
        ("root:1690000000:65536\n", True),
        ("containers:1700000000:100000000\nroot:1600000000:200000000\n", True),
        ("root:1690000001:65536\n", False),  # starts inside: 0 would not map
        ("root:1690000000:65535\n", False),  # one short
        ("cloudsdk:1690000000:65536\n", False),  # someone else's
        ("", False),
    ],
)
def test_the_builder_runs_only_where_root_owns_its_whole_range(
    tmp_path: Path, lines: str, ok: bool
) -> None:
    from metrale.benchmarks.terminal_bench.builder import subuid_range_ok

    files = (tmp_path / "subuid", tmp_path / "subgid")
    for path in files:
        path.write_text(lines)
    assert subuid_range_ok(files=tuple(str(p) for p in files)) is ok
