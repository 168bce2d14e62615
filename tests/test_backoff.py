"""One backoff rule for every retry loop: exponential, capped, jittered down from the cap."""

import random

from metrale.backoff import backoff_s


def test_the_cap_doubles_per_attempt_up_to_the_most() -> None:
    caps = [backoff_s(n, 0.5, 3.0, jitter=0.0) for n in range(1, 7)]
    assert caps == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_jitter_takes_at_most_its_fraction_off_the_cap() -> None:
    rng = random.Random(7)
    half = [backoff_s(3, 1.0, 30.0, jitter=0.5, rng=rng) for _ in range(2000)]
    assert 2.0 <= min(half) < 2.05 and 3.95 < max(half) <= 4.0
    full = [backoff_s(3, 1.0, 30.0, rng=rng) for _ in range(2000)]
    assert 0.0 <= min(full) < 0.05 and 3.95 < max(full) <= 4.0


def test_a_seeded_draw_repeats() -> None:
    draws = [[backoff_s(2, 1.0, 9.0, rng=random.Random(1)) for _ in range(3)] for _ in range(2)]
    assert draws[0] == draws[1]
