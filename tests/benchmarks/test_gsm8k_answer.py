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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the last `####` wins: a model that restates the question's numbers first
        ("#### 7\nwait, recount\n#### 9", "9"),
        ("#### 7 #### 8 #### 9 and 4 more", "9"),
        # a stronger marker beats a weaker one anywhere in the text
        ("#### 5. The answer is 6. \\boxed{7}", "5"),
        ("\\boxed{4}. The answer is 6.\nA: 8", "4"),
        ("The answer is 6.\nA: 8\nthen 9", "6"),
        ("A: 8\nthen 9", "8"),
        # whitespace, dollars and bold inside each marker; a later stray number must not win
        ("####   18 then 3", "18"),
        ("\\boxed{ 18 } over 3 days", "18"),
        ("\\boxed{\\$18} over 3 days", "18"),
        ("\\boxed{$ 18} over 3 days", "18"),
        ("the ANSWER IS: ** 42** after 7 steps", "42"),
        ("the answer is \\$42 after 7 steps", "42"),
        ("First 5.\n  answer :  ** 18 ** of 3", "18"),
        ("First 5.\na: 18 of 3", "18"),
        # the fallback: the last standalone number, not digits inside a word
        ("costs 4 for item3", "4"),
        ("it was -.5 then", "-0.5"),
        ("a $.75 tip", "0.75"),
    ],
)
def test_markers_priority_and_the_last_marker(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$1,234.50", "1234.5"),
        ("$ 1,000.00", "1000"),
        ("-0.50", "-0.5"),
        ("18.000", "18"),
        ("0.125", "0.125"),
        ("1e3", "1000"),
        ("-3", "-3"),
        ("-0", "0"),  # a model's "-0" is the reference's 0
        ("-0.00", "0"),
        ("Infinity", None),
        ("NaN", None),
        ("", None),
        ("twelve", None),
    ],
)
def test_normalize_number(text: str, expected: str | None) -> None:
    assert normalize_number(text) == expected


def test_reference_answer_is_the_number_after_the_last_marker() -> None:
    from metrale.benchmarks.gsm8k.answer import reference_answer

    assert reference_answer("3 + 4 = 7\n#### 7") == "7"
    assert reference_answer("#### 2 is wrong, so\n#### 1,200") == "1200"
    with pytest.raises(ValueError, match="no numeric answer: ' none'"):
        reference_answer("#### none")
    with pytest.raises(ValueError, match="no numeric answer: 'no marker at all'"):
        reference_answer("no marker at all")
