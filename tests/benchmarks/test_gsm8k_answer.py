from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metrale.benchmarks.gsm8k import extract_answer, load_problems, normalize_number


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so she has 9 eggs.\n#### 18", "18"),
        ("The total is \\boxed{18}.", "18"),
        ("The answer is 18.", "18"),
        ("A: 18", "18"),
        ("Answer: **18**", "18"),
        ("It costs $1,234.50 in total.", "1234.5"),
        ("The temperature fell to -5 degrees", "-5"),
        ("#### 18.0", "18"),
        ("She makes 18 dollars.", "18"),
        ("I got 3 apples, then 7 more!", "7"),
        ("The answer is: $42", "42"),
        ("#### 1,000", "1000"),
        ("answer is 0.50", "0.5"),
        ("first 12, then #### 7 and later 99", "7"),
        ("no number at all", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@given(st.decimals(min_value=-(10**7), max_value=10**7, places=2, allow_nan=False))
def test_marked_numbers_round_trip(value: Decimal) -> None:
    expected = normalize_number(str(value))
    assert expected is not None
    for text in (f"#### {value}", f"The answer is {value}.", f"\\boxed{{{value}}}"):
        assert extract_answer(text) == expected


@given(st.integers(min_value=1000, max_value=10**9))
def test_thousands_separators_and_dollars(value: int) -> None:
    assert extract_answer(f"The total is ${value:,}.") == str(value)
    assert extract_answer(f"The total is ${value:,}.00 in all") == str(value)


@given(st.text())
def test_never_raises(text: str) -> None:
    result = extract_answer(text)
    assert result is None or normalize_number(result) == result


def test_shipped_data_is_the_full_test_split_with_numeric_references() -> None:
    problems = load_problems()
    assert len(problems) == 1319
    assert problems[0].answer == "18"
    assert all(normalize_number(p.answer) == p.answer for p in problems)
