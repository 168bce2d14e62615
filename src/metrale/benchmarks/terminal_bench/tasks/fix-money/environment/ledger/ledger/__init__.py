"""A tiny ledger: amounts are integers of cents, never floats."""

from ledger.money import format_amount, parse_amount, split

__all__ = ["format_amount", "parse_amount", "split"]
