from pathlib import Path

import pytest

from metrale.budgets import load_budgets
from metrale.errors import UsageError
from metrale.plugin import (
    Benchmark,
    ParamSpec,
    check_bounds,
    discover,
    get_benchmark,
    validate_params,
)

SPECS = [
    ParamSpec(name="rollouts", type="int", default=8, min=1, max=100),
    ParamSpec(name="max_concurrent", type="int", default=None, min=1, nullable=True),
    ParamSpec(name="temperature", type="float", default=0.0, min=0.0, max=2.0),
    ParamSpec(name="stream", type="bool", default=True),
    ParamSpec(name="mode", type="str", default="a", choices=["a", "b"]),
]


def test_defaults_fill_in_and_strings_convert() -> None:
    values = validate_params(SPECS, {"rollouts": "12", "temperature": "0.5", "stream": "no"})
    assert values == {
        "rollouts": 12,
        "max_concurrent": None,
        "temperature": 0.5,
        "stream": False,
        "mode": "a",
    }


def test_nullable_accepts_none_and_numbers() -> None:
    assert validate_params(SPECS, {"max_concurrent": "none"})["max_concurrent"] is None
    assert validate_params(SPECS, {"max_concurrent": "4"})["max_concurrent"] == 4


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"rollouts": "abc"}, "is not an int; accepted: int in [1..100]"),
        ({"rollouts": "0"}, "below its minimum"),
        ({"rollouts": 101}, "above its maximum"),
        ({"rollouts": "none"}, "cannot be none"),
        ({"temperature": "hot"}, "is not a number"),
        ({"stream": "maybe"}, "accepted: true or false"),
        ({"mode": "c"}, "is not one of: a, b"),
        ({"bogus": 1}, "unknown parameter 'bogus'; valid parameters: max_concurrent, mode"),
        ({"rollouts": True}, "is not an int"),
    ],
)
def test_bad_values_name_the_problem_and_what_is_accepted(raw: dict, fragment: str) -> None:
    with pytest.raises(UsageError, match=None) as info:
        validate_params(SPECS, raw)
    assert fragment in str(info.value)


def test_check_bounds_reports_every_bound() -> None:
    verdict = check_bounds(
        {"reward_mean": 0.5, "e2e_s": 3.0}, {"reward_mean_min": 0.9, "e2e_s_max": 60, "ttft_max": 1}
    )
    assert verdict.passed is False
    by_metric = {c.metric: c for c in verdict.checks}
    assert by_metric["reward_mean"].passed is False
    assert by_metric["e2e_s"].passed is True
    assert by_metric["ttft"].passed is False and by_metric["ttft"].reason == "absent"
    assert len(verdict.lines()) == 3


def test_no_bounds_is_no_verdict() -> None:
    assert check_bounds({"x": 1}, {}).passed is None


def test_load_budgets(tmp_path: Path) -> None:
    f = tmp_path / "BENCH.toml"
    f.write_text("[gsm8k]\nreward_mean_min = 0.9\ne2e_s_max = 60\n[other]\nx_max = 1\n")
    assert load_budgets(f, "gsm8k") == {"reward_mean_min": 0.9, "e2e_s_max": 60.0}
    assert load_budgets(f, "absent") == {}
    f.write_text("[gsm8k]\nreward = 1\n")
    with pytest.raises(UsageError, match="must end in _min or _max"):
        load_budgets(f, "gsm8k")
    f.write_text("[gsm8k\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_budgets(f, "gsm8k")
    with pytest.raises(UsageError, match="does not exist"):
        load_budgets(tmp_path / "nope.toml", "gsm8k")


def test_builtins_register_through_entry_points() -> None:
    found = discover()
    assert "gsm8k" in found
    bench = found["gsm8k"]()
    assert isinstance(bench, Benchmark)
    names = [s.name for s in bench.parameters()]
    for required in ("rollouts", "max_concurrent", "max_tokens", "temperature", "seed"):
        assert required in names
    with pytest.raises(UsageError, match="unknown benchmark 'nope'; available: .*gsm8k"):
        get_benchmark("nope")


def test_background_run_polls_and_cancels() -> None:
    import asyncio

    from metrale.rollout import BackgroundRun

    async def go() -> None:
        work = BackgroundRun()
        assert not work.started_yet and work.elapsed_s == 0.0
        work.start(asyncio.sleep(0.05, result="done"))
        assert not await work.wait(0)
        assert await work.wait(5)
        assert work.result() == "done" and work.elapsed_s > 0

        failing = BackgroundRun()

        async def boom() -> None:
            raise ValueError("boom")

        failing.start(boom())
        with pytest.raises(ValueError, match="boom"):
            await failing.wait(5)

        endless = BackgroundRun()
        endless.start(asyncio.sleep(3600))
        await endless.cancel()
        assert endless._task is not None and endless._task.cancelled()

    asyncio.run(go())
