"""Exponential backoff with jitter, one rule for every retry loop (the client's retried
requests, the remote runtimes' refused creations)."""

from __future__ import annotations

import random


def backoff_s(
    attempt: int,
    first_s: float,
    most_s: float,
    *,
    jitter: float = 1.0,
    rng: random.Random | None = None,
) -> float:
    """The wait before retry `attempt` (1 for the first): `first_s * 2**(attempt-1)`, capped at
    `most_s`, of which a random fraction up to `jitter` is taken off (1.0: "full jitter", any
    wait from 0 to the cap; 0.5: between half the cap and the cap), so that many clients
    refused at once do not come back at once."""
    cap = min(most_s, first_s * 2.0 ** max(0, attempt - 1))
    draw = rng.random() if rng is not None else random.random()
    return cap * (1.0 - jitter * draw)
