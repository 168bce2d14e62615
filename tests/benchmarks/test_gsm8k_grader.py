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


def grade(awk_file: Path, text: str, ref: str = "18") -> tuple[int, dict | None]:
    path = awk_file.parent / "completion.txt"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    proc = subprocess.run(
        ["awk", "-v", f"ref={ref}", "-f", str(awk_file), str(path)],
        capture_output=True, text=True, env=ENV, timeout=30,
    )  # fmt: skip
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else None)


def test_equal_to_extract_answer_on_the_whole_data_set(awk_file: Path, tmp_path: Path) -> None:
    texts = [t for r in gsm8k_test() for t in (r.answer, r.question)]
    for i, text in enumerate(texts):
        (tmp_path / f"{i:05d}.txt").write_text(text, encoding="utf-8")
    # one shell for all of them: a Python subprocess per text would take most of the test
    script = 'for f in "$1"/*.txt; do awk -v ref=0 -f "$0" "$f"; echo "exit $?"; done'
    out = subprocess.run(
        ["sh", "-c", script, str(awk_file), str(tmp_path)],
        capture_output=True, text=True, env=ENV, timeout=300, check=True,
    ).stdout.splitlines()  # fmt: skip
    graded = declined = 0
    lines = iter(out)
    for text in texts:
        line = next(lines)
        if line == "exit 3":
            declined += 1
            assert any(ord(c) > 127 for c in text)
            continue
        assert next(lines) == "exit 0"
        assert json.loads(line)["parsed"] == extract_answer(text), text[-300:]
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
]


@pytest.mark.parametrize("text", CASES)
def test_equal_on_each_rules_corner_cases(awk_file: Path, text: str) -> None:
    code, verdict = grade(awk_file, text)
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
    if code == 3:
        assert any(ord(c) > 127 for c in text) or "." in text
        return
    assert code == 0 and verdict is not None
    assert verdict["parsed"] == extract_answer(text)


@pytest.mark.parametrize("text", ["résumé: #### 18", "١٨", "answer is\u00a018", "ſo 5"])
def test_declines_any_non_ascii_text(awk_file: Path, text: str) -> None:
    assert grade(awk_file, text) == (3, None)
