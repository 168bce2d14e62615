"""The cargo warm step, once per test session (and cached across sessions in ~/.cache/metrale)."""

from __future__ import annotations

import asyncio
import time

import pytest

from metrale.benchmarks.agentic_webserver.warm import WarmCache, find_toolchain, warm
from metrale.errors import UsageError


@pytest.fixture(scope="session")
def warm_cargo() -> WarmCache:
    try:
        toolchain = find_toolchain()
    except UsageError as exc:
        pytest.skip(str(exc))
    started = time.perf_counter()
    cache, _, built = asyncio.run(warm(toolchain))
    took = time.perf_counter() - started
    print(f"\nagentic_webserver warm step: {'built' if built else 'reused'} in {took:.1f} s")
    return cache
