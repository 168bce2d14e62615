from __future__ import annotations

import pytest

from metrale.errors import UsageError
from metrale.runtime import (
    BwrapConfig,
    RayConfig,
    SubprocessConfig,
    create_runtime,
    parse_runtime_config,
    runtime_config,
)


def test_unknown_runtime_names_the_accepted_ones() -> None:
    # every installed runtime, in one order whatever order the package metadata lists them in
    with pytest.raises(UsageError, match="accepted: bwrap, docker, modal, prime, ray, subprocess"):
        runtime_config("firecracker")


def test_option_that_does_not_apply_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="image do not apply to the bwrap runtime"):
        runtime_config("bwrap", image="python:3.12")
    with pytest.raises(UsageError, match="max_procs"):
        runtime_config("bwrap", max_procs="many")


def test_flat_limits_and_binds() -> None:
    cfg = runtime_config(
        "bwrap", max_procs=32, ro_binds=["/opt/cache"], rw_binds=["/tmp/t:/work/target"]
    )
    assert isinstance(cfg, BwrapConfig)
    assert cfg.limits.max_procs == 32 and cfg.limits.cpu_s is not None
    assert [(b.src, b.dst, b.writable) for b in cfg.binds] == [
        ("/opt/cache", None, False),
        ("/tmp/t", "/work/target", True),
    ]


def test_ray_takes_inner_options() -> None:
    cfg = runtime_config("ray", address="127.0.0.1:1", inner="bwrap", network=True)
    assert isinstance(cfg, RayConfig) and isinstance(cfg.inner, BwrapConfig)
    assert cfg.inner.network and cfg.address == "127.0.0.1:1"


def test_config_round_trips_through_json_by_type() -> None:
    for name in ("subprocess", "bwrap", "docker", "ray"):
        cfg = runtime_config(name)
        back = parse_runtime_config(cfg.model_dump(mode="json"))
        assert type(back) is type(cfg) and back == cfg


def test_create_runtime_picks_the_class() -> None:
    rt = create_runtime(SubprocessConfig())
    assert type(rt).__name__ == "SubprocessRuntime"
    assert type(create_runtime(BwrapConfig())).__name__ == "BwrapRuntime"


def test_runtime_factory_shares_one_start_rate_across_runtimes() -> None:
    import asyncio
    import time

    from metrale.runtime import runtime_factory

    make = runtime_factory(runtime_config("subprocess", start_rate=40.0))

    async def main() -> float:
        runtimes = [make(i) for i in range(5)]
        started = time.perf_counter()
        await asyncio.gather(*(rt.start() for rt in runtimes))
        elapsed = time.perf_counter() - started
        await asyncio.gather(*(rt.stop() for rt in runtimes))
        return elapsed

    assert asyncio.run(main()) >= 4 / 40 - 0.01
