"""Data sets shipped in the package, read by any benchmark that needs them (no hub, no network).

- `gsm8k_test()`: the GSM8K test split, 1,319 problems (Cobbe et al., 2021, "Training Verifiers to
  Solve Math Word Problems"; MIT licence, copyright 2021 OpenAI; `data/GSM8K_LICENSE`). The gsm8k
  benchmark grades against it; serve can use its questions as prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Gsm8kRow:
    index: int
    question: str
    #: the worked solution, ending in `#### <number>`
    answer: str


@cache
def gsm8k_test() -> tuple[Gsm8kRow, ...]:
    """The GSM8K test split, in file order (read once per process)."""
    text = resources.files(__package__).joinpath("data/gsm8k_test.jsonl").read_text("utf-8")
    rows: list[Gsm8kRow] = []
    for line in text.splitlines():
        if line.strip():
            row = json.loads(line)
            rows.append(Gsm8kRow(len(rows), row["question"], row["answer"]))
    return tuple(rows)
