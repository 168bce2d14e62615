"""Every command shown in README.md and docs/ runs as shown, so the docs cannot drift.

The convention (docs/architecture.md's "Commands in the docs" section says it for writers):

- A ```` ```console ```` block holds commands as `$ ` lines; the lines after one, up to the
  next `$ `, are its output as shown. A ```` ```bash ```` (or `sh`) block is commands only, one
  a line (a trailing `\\` continues a line; `#` lines are comments).
- Every command is run, in one temporary directory per page, against a real `metrale sim`:
  `$ metrale sim --port 8000 ... &` starts one (on a free port instead of 8000) and
  `127.0.0.1:8000` in later commands of the page is rewritten to it.
- A command must exit 0, or the code its trailing `# exit N` comment names.
- Where output is shown, its shape must match: its words (column names, labels, verdicts;
  not numbers or units) appear in the real output in the same order. A `...` line elides.
- Only `metrale` and a few file commands (`printf`, `echo`, `cat`, `ls`, `rm`) run unmarked,
  and nothing that touches the shared container engine; any other command fails this test
  until its block is marked.
- A block that cannot run here is preceded by a marker comment: `<!-- doc: run-by
  tests/PATH.py[::test_name] ... -->` (run by that test, which must exist) or
  `<!-- doc: ci-lacks WHAT -->` (needs what CI lacks; the reason is required).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_PORT = "127.0.0.1:8000"
MARKER = re.compile(r"<!--\s*doc:\s*(run-by|ci-lacks)\s+(.*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\b.*$")
#: words of output that are units: the unit of a column follows the numbers in it
UNITS = {"ms", "us"}
#: what an unmarked block may run: metrale and a few file commands. Anything else (scripts that
#: install packages or take hours, the shared container engine) must be marked, so that this
#: test never starts it by surprise.
ALLOWED = {"metrale", "printf", "echo", "cat", "ls", "rm"}
ENGINE_WORDS = ("docker", "podman", "container-engine", "terminal_bench", "terminal-bench",
                "metrale cleanup")  # fmt: skip


@dataclass
class Command:
    line: int
    text: str
    shown: list[str] = field(default_factory=list)


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    marker: tuple[str, str] | None
    commands: list[Command]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> Iterator[Block]:
    """The command blocks of one page, each with the marker that precedes it, if any."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, lang = i, fence.group(1)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        i = end + 1
        if lang not in ("console", "bash", "sh"):
            continue
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        found = MARKER.search(before)
        marker = (found.group(1), found.group(2)) if found else None
        body = lines[start + 1 : end]
        parse = console_commands if lang == "console" else bash_commands
        commands = parse(body, start)
        yield Block(path, start + 1, lang, marker, commands)


def joined(body: list[str], k: int) -> tuple[str, int]:
    """Line k with its `\\` continuations, and the index after them."""
    text = body[k]
    while text.endswith("\\") and k + 1 < len(body):
        k += 1
        text = text[:-1] + " " + body[k].strip()
    return text, k + 1


def console_commands(body: list[str], offset: int) -> list[Command]:
    commands: list[Command] = []
    k = 0
    while k < len(body):
        if body[k].startswith("$ "):
            text, k = joined(body, k)
            commands.append(Command(offset + k + 1, text[2:]))
        else:
            if commands:
                commands[-1].shown.append(body[k])
            k += 1
    return commands


def bash_commands(body: list[str], offset: int) -> list[Command]:
    commands = []
    k = 0
    while k < len(body):
        if not body[k].strip() or body[k].lstrip().startswith("#"):
            k += 1
            continue
        text, k = joined(body, k)
        commands.append(Command(offset + k + 1, text))
    return commands


def needs_marker(text: str) -> str | None:
    """Why a command may not run unmarked, or None when it may."""
    first = shlex.split(text, comments=True)[0] if text.strip() else ""
    if first not in ALLOWED:
        return f"it runs {first!r}, not metrale"
    hit = next((w for w in ENGINE_WORDS if w in text), None)
    return f"it uses the shared container engine ({hit})" if hit else None


def words(text: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z_][A-Za-z_]+", text) if w not in UNITS]


def is_subsequence(needles: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


class Page:
    """One page's commands run in order, in one directory, with its simulators."""

    def __init__(self, path: Path, cwd: Path, bindir: Path) -> None:
        self.path, self.cwd = path, cwd
        self.env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
        self.sim: subprocess.Popen[str] | None = None
        self.address: str | None = None

    def where(self, command: Command) -> str:
        return f"{self.path.relative_to(ROOT)}:{command.line}: {command.text}"

    def start_sim(self, command: Command) -> None:
        self.stop_sim()
        argv = shlex.split(command.text.rstrip("& "))
        assert argv[:2] == ["metrale", "sim"], self.where(command)
        if "--port" in argv:
            argv[argv.index("--port") + 1] = "0"
        self.sim = subprocess.Popen(
            [sys.executable, "-m", "metrale", *argv[1:]],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=self.cwd, env=self.env, start_new_session=True,
        )  # fmt: skip
        assert self.sim.stdout is not None
        line = self.sim.stdout.readline()
        assert "listening on" in line, f"{self.where(command)}: the sim did not start: {line}"
        self.address = re.sub(r"^https?://", "", line.rsplit(" ", 1)[-1].strip()).split("/")[0]

    def stop_sim(self) -> None:
        if self.sim is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sim.pid, signal.SIGTERM)
        try:
            self.sim.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.sim.pid, signal.SIGKILL)
            self.sim.wait()
        if self.sim.stdout is not None:
            self.sim.stdout.close()
        self.sim = None

    def run(self, command: Command) -> None:
        text = command.text
        why = needs_marker(text)
        assert why is None, (
            f"{self.where(command)}\n{why}: mark its block `<!-- doc: run-by tests/....py -->` "
            "or `<!-- doc: ci-lacks WHAT -->` (see this module's docstring)"
        )
        if text.startswith("metrale sim ") and text.rstrip().endswith("&"):
            self.start_sim(command)
            return
        expected = 0
        code = EXIT.search(text)
        if code:
            expected, text = int(code.group(1)), text[: code.start()]
        if DOC_PORT in text:
            assert self.address, f"{self.where(command)}: no `metrale sim --port 8000 &` before it"
            text = text.replace(DOC_PORT, self.address)
        done = subprocess.run(
            ["bash", "-c", text], capture_output=True, text=True, timeout=180,
            cwd=self.cwd, env=self.env,
        )  # fmt: skip
        output = done.stdout + done.stderr
        assert done.returncode == expected, (
            f"{self.where(command)}\nexit {done.returncode}, expected {expected}\n{output[-2000:]}"
        )
        shown = words("\n".join(s for s in command.shown if s.strip() != "..."))
        assert is_subsequence(shown, words(output)), (
            f"{self.where(command)}\nthe output's shape differs from the doc's\n"
            f"shown words: {shown}\nreal output:\n{output[-3000:]}"
        )


def check_marker(block: Block) -> None:
    kind, reason = block.marker or ("", "")
    where = f"{block.path.relative_to(ROOT)}:{block.line}"
    assert reason, f"{where}: a `doc: {kind}` marker needs a reason"
    if kind == "run-by":
        named = re.match(r"(tests/\S+?\.py)(?:::(\w+))?", reason)
        assert named, f"{where}: `run-by` names no tests/....py file: {reason}"
        test_file = ROOT / named.group(1)
        assert test_file.is_file(), f"{where}: {named.group(1)} does not exist"
        if named.group(2):
            assert f"def {named.group(2)}(" in test_file.read_text(), (
                f"{where}: {named.group(1)} has no test {named.group(2)}"
            )


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    """`metrale` on PATH as this interpreter's `-m metrale`, the tree under test."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    script = bin_ / "metrale"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m metrale "$@"\n')
    script.chmod(0o755)
    return bin_


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_on_the_page_runs_as_shown(path: Path, tmp_path: Path, bindir: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    page = Page(path, work, bindir)
    try:
        for block in blocks(path):
            if block.marker is not None:
                check_marker(block)
                continue
            for command in block.commands:
                page.run(command)
    finally:
        page.stop_sim()


def test_the_parser_sees_commands_output_and_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```console\n$ metrale sim --port 8000 &\n$ metrale run x \\\n    --quiet   # exit 1\n"
        "a b\n...\n```\n\n<!-- doc: ci-lacks an engine -->\n```bash\n# c\nmetrale cleanup\n```\n"
        "```toml\nnot = 'a command'\n```\n"
    )
    found = list(blocks(page))
    assert [b.lang for b in found] == ["console", "bash"]
    console, bash = found
    assert [c.text for c in console.commands] == [
        "metrale sim --port 8000 &",
        "metrale run x  --quiet   # exit 1",
    ]
    assert console.commands[1].shown == ["a b", "..."] and console.marker is None
    assert bash.marker == ("ci-lacks", "an engine")
    assert [c.text for c in bash.commands] == ["metrale cleanup"]
    assert needs_marker("metrale run gsm8k --rollouts 4") is None
    assert needs_marker("bash scripts/test.sh") == "it runs 'bash', not metrale"
    assert needs_marker("metrale exec --runtime docker -- id")
    assert needs_marker("metrale cleanup --all")
    assert is_subsequence(["cell", "setup"], ["cell", "conc", "setup", "total"])
    assert not is_subsequence(["setup", "cell"], ["cell", "conc", "setup", "total"])
