"""What an emulator injects to behave like a real sandbox service under load, seeded so a
rehearsal replays: creation latency drawn from a distribution, a creation rate limit, a quota
of live sandboxes, creations stuck pending forever, and gateway failures mid-command.

The latency is a lognormal fitted to two quantiles (`--create-latency P50,P90`): the median
is `exp(mu)` and the 90th percentile `exp(mu + 1.2816 sigma)`, so a seed's published p50 and
p90 can be replayed as they were measured. `P50,P50` (or one number) is a constant.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from metrale.errors import UsageError

#: z of the standard normal's 90th percentile
_Z90 = 1.2815515655446004


@dataclass(frozen=True)
class FaultConfig:
    #: creation latency p50 and p90 in seconds (None: none added)
    create_latency: tuple[float, float] | None = None
    #: creations per second the service accepts; over it: 429 / RESOURCE_EXHAUSTED
    create_rate: float | None = None
    #: live sandboxes at most; a creation over it is refused like one over the rate
    quota: int | None = None
    #: fraction of creations that stay pending forever
    stuck: float = 0.0
    #: fraction of commands whose gateway fails mid-command
    gateway_fail: float = 0.0
    seed: int = 0


def parse_latency(text: str) -> tuple[float, float]:
    """`P50,P90` (or `P50`) seconds, 0 <= P50 <= P90 <= 3600."""
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values *= 2
    if len(values) != 2 or not all(math.isfinite(v) for v in values):
        raise UsageError(f"--create-latency {text!r} must be P50,P90 in seconds, e.g. 10.9,14")
    p50, p90 = values
    if not 0 <= p50 <= p90 <= 3600:
        raise UsageError(f"--create-latency {text!r}: accepted 0 <= P50 <= P90 <= 3600 seconds")
    return p50, p90


def parse_fraction(flag: str, value: float) -> float:
    if not 0 <= value <= 1:
        raise UsageError(f"{flag} {value} is outside 0..1")
    return value


class Faults:
    """The injected behaviour of one emulator (one seeded generator for all its draws)."""

    def __init__(self, config: FaultConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        rate = config.create_rate
        #: token bucket: one second's worth of creations (at least one) may arrive at once
        self._burst = max(1.0, float(rate)) if rate else 0.0
        self._tokens = self._burst
        self._refilled = time.monotonic()
        self.refused = 0

    def creation_latency(self) -> float:
        """Seconds a creation stays pending before its sandbox starts (its own start aside)."""
        if self.config.create_latency is None:
            return 0.0
        p50, p90 = self.config.create_latency
        if p50 <= 0:
            return 0.0
        sigma = (math.log(p90) - math.log(p50)) / _Z90
        return p50 if sigma == 0 else self._rng.lognormvariate(math.log(p50), sigma)

    def admit_creation(self, live: int) -> str | None:
        """None when a creation is accepted now, else why it is refused (the caller answers
        429 / RESOURCE_EXHAUSTED): over the rate, or the quota of live sandboxes reached."""
        quota = self.config.quota
        if quota is not None and live >= quota:
            self.refused += 1
            return f"quota of {quota} live sandboxes reached"
        rate = self.config.create_rate
        if not rate:
            return None
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        if self._tokens < 1:
            self.refused += 1
            return f"rate limit exceeded: {rate:g} sandbox creations per second"
        self._tokens -= 1
        return None

    def stuck(self) -> bool:
        """Whether this creation stays pending forever."""
        return self.config.stuck > 0 and self._rng.random() < self.config.stuck

    def gateway_fails(self) -> bool:
        """Whether this command's gateway fails mid-command."""
        return self.config.gateway_fail > 0 and self._rng.random() < self.config.gateway_fail
