"""The awk grader is `extract_answer`: on the whole GSM8K test set (solutions and questions),
on hand-picked corner cases of each rule, and on generated texts built from the tokens the
rules look at. Where it declines (exit 3: non-ASCII, over-long fractions) grader.py decides."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale.benchmarks.gsm8k.answer import extract_answer
from metrale.benchmarks.gsm8k.benchmark import grader_awk
from metrale.datasets import gsm8k_test

pytestmark = pytest.mark.skipif(shutil.which("awk") is None, reason="no awk on this machine")

ENV = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="module")
def awk_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("grader") / "grader.awk"
    path.write_text(grader_awk())
    return path


#: how the text reaches awk: as the file it reads, or as an argument (`text_arg`), as metrale
#: gives it (the program as an argument too)
HOW = ["file", "argument"]


def grade(awk_file: Path, text: str, ref: str = "18", how: str = "file") -> tuple[int, dict | None]:
    data = text.encode("utf-8", "surrogatepass")
    if how == "file" or b"\0" in data:  # no argument holds a NUL: metrale writes the file
        path = awk_file.parent / "completion.txt"
        path.write_bytes(data)
        argv = ["awk", "-v", f"ref={ref}", "-f", str(awk_file), str(path)]
    else:
        argv = ["awk", "-v", f"ref={ref}", "-v", "text_arg=1", awk_file.read_text(), data]
    proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=30)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else None)


#: every text in `$1`, graded as a file and as an argument (`$(...; echo x)` keeps its last
#: newlines), a line each (the exit status, then the verdict), in one shell: a Python
#: subprocess per text would take most of the test
EACH_TEXT = """for f in "$1"/*.txt; do
  v=$(awk -v ref=0 -f "$0" "$f"); echo "$? $v"
  t=$(cat "$f"; echo x); v=$(awk -v ref=0 -v text_arg=1 "$(cat "$0")" "${t%x}"); echo "$? $v"
done"""


def test_equal_to_extract_answer_on_the_whole_data_set(awk_file: Path, tmp_path: Path) -> None:
    texts = [t for r in gsm8k_test() for t in (r.answer, r.question)]
    for i, text in enumerate(texts):
        (tmp_path / f"{i:05d}.txt").write_text(text, encoding="utf-8")
    out = subprocess.run(
        ["sh", "-c", EACH_TEXT, str(awk_file), str(tmp_path)],
        capture_output=True, text=True, env=ENV, timeout=300, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert len(out) == 2 * len(texts)
    graded = declined = 0
    for i, text in enumerate(texts):
        as_file, as_argument = out[2 * i], out[2 * i + 1]
        assert as_file == as_argument, text[-300:]
        code, _, verdict = as_file.partition(" ")
        if code == "3":
            declined += 1
            assert any(ord(c) > 127 for c in text) and not verdict
            continue
        assert code == "0"
        assert json.loads(verdict)["parsed"] == extract_answer(text), text[-300:]
        graded += 1
    assert graded == 2 * 1319 - declined and graded > 2400  # awk graded nearly all of it


CASES = [
    "",
    "\n",
    "no number here",
    "#### 18",
    "####18",
    "#####5",
    "#### -\t5",
    "#### $1,234.50",
    "#### .5",
    "#### -$.50",
    "#### x 7",
    "\\boxed{42}",
    "\\boxed{ \\$ 3,000}",
    "\\boxed{$-5}",
    "The answer is 12.",
    "the ANSWER is: **$ 7.50**",
    "answer  is\n\n-3",
    "answers is 4 then 9",
    "A: 5\nB: 6",
    "  answer: 3",
    "\n\n  a:** 2",
    "Answer : -0",
    "xA: 4",
    "x-5 y.5 1.5.6",
    "1234,567",
    "1,2345",
    "$-5",
    "- 5",
    "-\t5",
    "a5 _6 .7",
    "1e5",
    "0.000",
    "-0.0",
    "007.250",
    "12,34",
    "3,000,000.00 and 2",
    "0.1234567890123456789012345678",
    "1.0000000000000000000000000001",
    "\x1c5",
    "#### \x1f-5",
    "5\x00 6",
    "answer is\t\x0b 8",
    "\\boxed{\n$\n9}",
    "18\n",
    "A:\n\n",
    "answer: 7\n\n\n",
    "-v",
    "x=5",
]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("text", CASES)
def test_equal_on_each_rules_corner_cases(awk_file: Path, text: str, how: str) -> None:
    code, verdict = grade(awk_file, text, how=how)
    if code == 3:  # declined: only a fraction longer than Decimal's precision, here
        assert "." in text and len(text) > 28
        return
    assert code == 0 and verdict is not None
    assert verdict["parsed"] == extract_answer(text)
    assert verdict["reward"] == (1.0 if extract_answer(text) == "18" else 0.0)


TOKENS = [
    *"0123456789", ",", ".", "$", "-", " ", "\t", "\n", "\r", "\x0b", "\x1d", "#", "*", ":",
    "\\", "{", "_", "a", "A", "x", "is", "IS", "####", "\\boxed{", "answer", "Answer", "answer is",
    "A:", "1,234", "18",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=24).map("".join))
def test_equal_on_generated_texts(awk_file: Path, text: str) -> None:
    code, verdict = grade(awk_file, text)
    assert grade(awk_file, text, how="argument") == (code, verdict)
    if code == 3:
        assert any(ord(c) > 127 for c in text) or "." in text
        return
    assert code == 0 and verdict is not None
    assert verdict["parsed"] == extract_answer(text)


@pytest.mark.parametrize("text", ["résumé: #### 18", "١٨", "answer is\u00a018", "ſo 5"])
@pytest.mark.parametrize("how", HOW)
def test_declines_any_non_ascii_text(awk_file: Path, text: str, how: str) -> None:
    assert grade(awk_file, text, how=how) == (3, None)
