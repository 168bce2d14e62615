"""Synthetic cells for the tests that need no run: seeded samples of known distributions."""

from __future__ import annotations

import random

from metrale.matrix.cellfile import CellResult
from metrale.plugin import get_benchmark


def make_cell(
    name: str = "none-r64",
    *,
    runtime: str = "none",
    rollouts: int = 64,
    max_concurrent: int | None = None,
    scale: float = 1.0,
    seed: int = 0,
    reward_p: float = 0.5,
    errors: int = 0,
    status: str = "completed",
    error: str | None = None,
    finished: int | None = None,
) -> CellResult:
    """A cell whose stage durations are lognormal around setup 2 ms, generation 0.5 s,
    scoring 50 µs, times `scale`."""
    rng = random.Random(seed)
    n = rollouts if finished is None else finished

    def draw(median: float) -> list[float]:
        return sorted(median * scale * rng.lognormvariate(0, 0.25) for _ in range(n))

    setup, generation, scoring = draw(0.002), draw(0.5), draw(50e-6)
    total = sorted(a + b + c for a, b, c in zip(setup, generation, scoring, strict=True))
    rewards = sorted(1.0 if rng.random() < reward_p else 0.0 for _ in range(n))
    return CellResult(
        # as `matrix` writes it: with the declarations of the metrics its numbers are
        declared=[m.declaration() for m in get_benchmark("gsm8k")().metrics()],
        cell=name,
        benchmark="gsm8k",
        runtime=runtime,
        rollouts=rollouts,
        max_concurrent=max_concurrent,
        target="http://127.0.0.1:1/v1",
        model="m",
        started_at="2026-01-01T00:00:00+00:00",
        status=status,  # type: ignore[arg-type]
        error=error,
        e2e_s=sum(total) / 4,
        records=n,
        errors=errors,
        rewards=rewards,
        reward_mean=sum(rewards) / len(rewards) if rewards else None,
        durations={"setup": setup, "generation": generation, "scoring": scoring, "total": total},
    )
