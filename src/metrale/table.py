"""Plain, Markdown and CSV rendering of small tables: the one place columns get aligned, and
where a cell's text (a cell name, an error from a run directory) is made safe to print
(`fmt.safe_text`)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from metrale.fmt import safe_text, sig


def render(columns: Sequence[str], rows: Sequence[Sequence[object]], style: str = "plain") -> str:
    """Render rows under column headers as `plain` (aligned), `markdown` or `csv` text."""
    columns = [safe_text(c, lines=False) for c in columns]
    cells = [[safe_text(_text(c), lines=False) for c in row] for row in rows]
    if style == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(cells)
        return buf.getvalue().rstrip("\n")
    widths = [len(c) for c in columns]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    if style == "markdown":
        head = "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |"
        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        body = [
            "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
            for row in cells
        ]
        return "\n".join([head, rule, *body])
    if style != "plain":
        raise ValueError(f"unknown table style {style!r}; accepted: plain, markdown, csv")
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return sig(value)
    return str(value)
