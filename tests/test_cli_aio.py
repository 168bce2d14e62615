"""The event loop a command runs on (`cli/aio.py`): the collector's settings while it runs."""

from __future__ import annotations

import gc

from metrale.cli.aio import GC_YOUNG_THRESHOLD, run_async


def test_the_loop_runs_with_a_larger_young_generation_and_puts_the_collector_back() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()

    async def inside() -> tuple[tuple[int, int, int], int]:
        return gc.get_threshold(), gc.get_freeze_count()

    during, frozen_during = run_async(inside)
    assert during == (GC_YOUNG_THRESHOLD, *before[1:])
    assert frozen_during > frozen  # what existed before the loop is out of every collection
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()
