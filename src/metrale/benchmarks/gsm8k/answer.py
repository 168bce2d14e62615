"""Final-answer extraction for GSM8K-style outputs.

The extractor looks for the most explicit marker first and falls back to weaker ones:
`#### N` (the dataset's own format), `\\boxed{N}`, "the answer is N", a line starting `A:` or
`Answer:`, and finally the last number anywhere in the text. Numbers are normalized so that
`$1,234.50`, `1234.5` and `1234.50` compare equal, as do `18.0` and `18`.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\$?\.\d+"
_NUMBER_RE = re.compile(rf"(?<![\w.]){_NUMBER}")
_MARKERS = (
    re.compile(rf"####\s*({_NUMBER})"),
    re.compile(rf"\\boxed\{{\s*\\?\$?\s*({_NUMBER})"),
    re.compile(rf"answer\s+is\s*:?\s*\\?\$?\**\s*({_NUMBER})", re.IGNORECASE),
    re.compile(rf"^\s*(?:A|Answer)\s*:\s*\**\s*({_NUMBER})", re.IGNORECASE | re.MULTILINE),
)


def normalize_number(text: str) -> str | None:
    """`$1,234.50` -> `1234.5`, `18.0` -> `18`, `-3` -> `-3`; None when it is not a number."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").strip()
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def extract_answer(text: str) -> str | None:
    """The normalized final number of a model's answer, or None when it states no number."""
    for marker in _MARKERS:
        found = marker.findall(text)
        if found:
            return normalize_number(found[-1])
    numbers = _NUMBER_RE.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def reference_answer(solution: str) -> str:
    """The normalized number after `####` in a GSM8K reference solution."""
    answer = solution.rsplit("####", 1)[-1]
    normalized = normalize_number(answer)
    if normalized is None:
        raise ValueError(f"reference solution has no numeric answer: {answer!r}")
    return normalized
