"""Issue 21 item 4: every file metrale reads back from a run or sweep directory is data that
may be malformed or hostile. `report`, `report --html`, `compare` and `run --resume` answer
any malformation with one line naming the file (and the field), exit 2, no traceback; and a
FIFO, `/dev/zero` (or a link to it) or a huge file in place of any of those files never hangs
or balloons them.

The malformations are generated over every field of real files (a run of gsm8k against the
simulator, a sweep's cell file), not listed by hand, and the listed ones are checked by name.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metrale.cli import main
from metrale.matrix.cellfile import write_cell
from tests.conftest import Sim, run_cli, start_sim
from tests.matrix.helpers import make_cell

#: Values of every JSON type, each of which is the wrong type for most fields.
WRONG: dict[str, Any] = {
    "a list": [1, "a"],
    "an object": {"a": {"b": 1}},
    "a string": "x",
    "a float": 1.5,
    "a negative int": -7,
    "null": None,
    "a bool": True,
    "a huge number": 1e308,
}
#: The wrong types tried one level down (every type at the top level): enough to reach each
#: nested field's validation at a third of the time.
NESTED = ("a list", "an object", "a string")
#: run.json, result.json, summary.json: JSON documents; rollouts.jsonl and transcripts: lines.
DOCUMENTS = ("run.json", "result.json", "summary.json")


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    with start_sim("--error-rate", "0.3", "--seed", "5") as s:
        yield s


@pytest.fixture(scope="module")
def run_dir(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("good") / "run"
    proc = run_cli([
        "run", "gsm8k", "--target", sim.url, "--no-preflight", "--quiet", "--out", str(out),
        "--rollouts", "6", "--max-tokens", "4", "--retries", "0",
    ], timeout=120, env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"})  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    (out / "transcripts").mkdir()
    (out / "transcripts" / "0.jsonl").write_text(
        json.dumps({"role": "user", "content": "hi"}) + "\n"
    )
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    write_cell(out, make_cell("none-r64", errors=2))
    return out


def json_mutations(doc: Any) -> Iterator[tuple[str, Any]]:
    """The document replaced whole by each wrong type, and each field (and each field of an
    object field) replaced by each wrong type."""
    for name, bad in WRONG.items():
        yield f"the document is {name}", bad
    if not isinstance(doc, dict):
        return
    for key, value in doc.items():
        for name, bad in WRONG.items():
            if bad != value:
                yield f"{key} is {name}", {**doc, key: bad}
        if isinstance(value, dict):
            for sub, inner in value.items():
                for name in NESTED:
                    if WRONG[name] != inner:
                        changed = {**value, sub: WRONG[name]}
                        yield f"{key}.{sub} is {name}", {**doc, key: changed}


def text_mutations(data: bytes) -> Iterator[tuple[str, bytes]]:
    yield "truncated", data[: len(data) // 2]
    yield "empty", b""
    yield "not UTF-8", b"\xff\xfe" + data[2:]


def _invoke(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)  # anything but a MetraleError escapes here and fails the test
    return code, capsys.readouterr().err


def _judge(code: int, err: str, name: str, argv: list[str], where: Path) -> None:
    """A 2 is one line naming the damaged file (or, for a value of the right type that does
    not fit, such as two benchmarks that do not compare, its directory; or, for a resume that
    already said what it uses from the directory, a model the target does not serve)."""
    assert "Traceback" not in err, err
    if code == 2:
        last = err.strip().splitlines()[-1]
        assert last.startswith("metrale: error:"), (argv, err)
        said = err.startswith(f"resuming {where}")
        assert name in last or where.name in last or said, (argv, err)


def _mutated_run_dirs(run_dir: Path, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A copy of `run_dir` per malformation of each of its files."""
    n = 0

    def copy_with(name: str, data: bytes) -> Path:
        nonlocal n
        n += 1
        copy = tmp_path / f"m{n}"
        shutil.copytree(run_dir, copy)
        (copy / name).write_bytes(data)
        return copy

    for name in DOCUMENTS:
        raw = (run_dir / name).read_bytes()
        doc = json.loads(raw)
        for what, bad in json_mutations(doc):
            yield name, what, copy_with(name, json.dumps(bad).encode())
        for what, data in text_mutations(raw):
            yield name, what, copy_with(name, data)
    for name in ("rollouts.jsonl", "transcripts/0.jsonl"):
        lines = (run_dir / name).read_bytes().splitlines(keepends=True)
        row = json.loads(lines[0])
        for what, bad in json_mutations(row):
            data = b"".join([json.dumps(bad).encode() + b"\n", *lines[1:]])
            yield name, f"line 1: {what}", copy_with(name, data)


def test_every_malformation_of_a_run_dir_is_one_line_or_harmless(
    run_dir: Path, sim: Sim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over every generated malformation: `report` (table and page), `compare` and `resume`
    exit 0/1 or 2, and a 2 is one line naming the damaged file; never a traceback."""
    os.environ.pop("OPENAI_API_KEY", None)
    seen = 0
    for name, what, copy in _mutated_run_dirs(run_dir, tmp_path):
        file_name = Path(name).name
        commands = [
            ["report", str(copy)],
            ["report", str(copy), "--html", str(copy / "page.html")],
            ["compare", str(run_dir), str(copy)],
        ]
        if name in ("run.json", "rollouts.jsonl") and "." not in what.removeprefix("line 1: "):
            commands.append(["run", "--resume", str(copy), "--no-preflight", "--quiet"])
        for argv in commands:
            code, err = _invoke(argv, capsys)
            assert code in (0, 1, 2), (name, what, argv, err)
            _judge(code, err, file_name, argv, copy)
            seen += 1
    assert seen > 400  # the generator reached every field


@pytest.mark.parametrize(
    ("name", "edit", "field"),
    [
        ("result.json", lambda d: [d], "result.json"),
        ("run.json", lambda d: "a string", "run.json"),
        ("run.json", lambda d: {**d, "params": [1, 2]}, "params"),
        ("run.json", lambda d: {**d, "budgets": "tight"}, "budgets"),
        ("run.json", lambda d: {**d, "budgets": {"reward_mean_min": "high"}}, "budgets"),
        ("run.json", lambda d: {**d, "runtime": "bwrap"}, "runtime"),
        ("run.json", lambda d: {**d, "client": {"retries": "many"}}, "retries"),
        ("result.json", lambda d: {**d, "result": {"metrics": {"e2e_s": "fast"}}}, "metrics"),
        ("result.json", lambda d: {**d, "result": {"status": "failed", "error": {}}}, "error"),
        ("summary.json", lambda d: {**d, "durations": {"total": "slow"}}, "durations"),
        ("summary.json", lambda d: [d], "summary.json"),
    ],
)
def test_the_named_malformations_name_their_file_and_field(
    run_dir: Path, tmp_path: Path, name: str, edit: Any, field: str
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / name).write_text(json.dumps(edit(json.loads((copy / name).read_text()))))
    for argv in (["report", str(copy)], ["compare", str(copy), str(run_dir)]):
        proc = run_cli(argv, timeout=60)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0] and field in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_record_whose_error_is_an_object_is_named(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    for name in ("result.json", "summary.json"):
        (copy / name).unlink()  # the table is made from the records
    lines = (copy / "rollouts.jsonl").read_text().splitlines(keepends=True)
    row = json.loads(lines[0])
    row["error"] = {"type": {"nested": 1}, "message": ["a"]}
    (copy / "rollouts.jsonl").write_text(json.dumps(row) + "\n" + "".join(lines[1:]))
    for argv in (["report", str(copy)], ["run", "--resume", str(copy), "--no-preflight"]):
        proc = run_cli(argv, timeout=60)
        assert proc.returncode == 2, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert "rollouts.jsonl" in last and "line 1" in last and "error" in last, proc.stderr


def test_every_malformation_of_a_cell_file_is_one_line(
    sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = next(sweep_dir.glob("*.json"))
    raw = path.read_bytes()
    cases = [(w, json.dumps(b).encode()) for w, b in json_mutations(json.loads(raw))]
    cases += list(text_mutations(raw))
    for i, (what, data) in enumerate(cases):
        copy = tmp_path / f"s{i}"
        copy.mkdir()
        (copy / path.name).write_bytes(data)
        for argv in (["report", str(copy)], ["compare", str(sweep_dir), str(copy)]):
            code, err = _invoke(argv, capsys)
            assert code in (0, 1, 2), (what, err)
            _judge(code, err, path.stem, argv, copy)  # the file, or the cell it holds
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    cell = json.loads(raw)
    (explicit / path.name).write_text(json.dumps({**cell, "errors": "several"}))
    code, err = _invoke(["report", str(explicit)], capsys)
    assert code == 2 and path.name in err and "errors" in err, err


# --------------------------------------------------------------------------- special files

GIB = 2**30


def _limited() -> None:
    """The child may use 3 GiB of address space: a reader that gathers /dev/zero dies of a
    MemoryError (a traceback) rather than taking the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (3 * GIB, 3 * GIB))


def _special(kind: str, path: Path) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        with path.open("wb") as f:
            f.truncate(5 * GIB)  # sparse: no disk used, 5 GiB to a reader
    elif kind == "directory":
        path.mkdir()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "huge", "directory"])
@pytest.mark.parametrize(
    "name", ["run.json", "result.json", "summary.json", "rollouts.jsonl", "transcripts/0.jsonl"]
)
def test_a_special_file_in_a_run_dir_never_hangs_or_balloons(
    run_dir: Path, tmp_path: Path, name: str, kind: str
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    if name != "rollouts.jsonl":
        (copy / "result.json").unlink()  # the page then reads the records too
        (copy / "summary.json").unlink()
        if name in ("result.json", "summary.json"):
            (copy / "result.json").write_text((run_dir / "result.json").read_text())
    _special(kind, copy / name)
    commands = [["report", str(copy), "--html", str(tmp_path / "page.html")]]
    if name in ("run.json", "rollouts.jsonl"):
        commands.append(["run", "--resume", str(copy), "--no-preflight", "--quiet"])
    for argv in commands:
        proc = subprocess.run(
            [sys.executable, "-m", "metrale", *argv],
            capture_output=True,
            text=True,
            timeout=60,  # a hang fails here
            preexec_fn=_limited,
            env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"},
        )
        assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr
        assert proc.returncode in (0, 1, 2, 3), proc.stderr
        if proc.returncode == 2:
            last = proc.stderr.strip().splitlines()[-1]
            assert Path(name).name in last, proc.stderr
