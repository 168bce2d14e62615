"""Sweep definition: axes from flags and TOML, cell names, and one-line errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale.errors import UsageError
from metrale.matrix.execute import plan_sweep
from metrale.matrix.sweep import Tier, build_sweep, cell_name, parse_tier_flag, select


def sweep(**kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = dict(
        benchmark="gsm8k", config=None, runtime=None, rollouts=None, max_concurrent=None,
        params=[], tiers=[], target=None, model=None, out=Path("out"),
    )  # fmt: skip
    args.update(kw)
    return build_sweep(**args)  # type: ignore[arg-type]


def test_cell_names_follow_the_issue() -> None:
    assert cell_name("bwrap", 64, None) == "bwrap-r64"
    assert cell_name("bwrap", 64, 128) == "bwrap-r64-c128"
    assert cell_name("ray", 8, 2, tier="fp8") == "fp8-ray-r8-c2"
    assert cell_name("none", 8, None, params={"max_turns": 32}) == "none-r8-max_turns=32"


def test_flags_make_the_product_in_sweep_order() -> None:
    s = sweep(runtime="none", rollouts="4,8", max_concurrent="none,2", params=["seed=1,2"])
    names = [c.name for c in plan_sweep(s).cells]
    assert names == [
        "none-r4-seed=1", "none-r4-seed=2", "none-r4-c2-seed=1", "none-r4-c2-seed=2",
        "none-r8-seed=1", "none-r8-seed=2", "none-r8-c2-seed=1", "none-r8-c2-seed=2",
    ]  # fmt: skip


def test_a_fixed_param_is_not_in_the_name_and_rollouts_default_to_the_benchmark() -> None:
    plan = plan_sweep(sweep(params=["max_tokens=32"]))
    assert [c.name for c in plan.cells] == ["none-r64"]
    assert plan.cells[0].params == {"max_tokens": "32"}


def test_tiers_appear_in_names_only_when_more_than_one() -> None:
    one = plan_sweep(sweep(tiers=["fp8=http://a:1"], rollouts="2"))
    assert [c.name for c in one.cells] == ["none-r2"]
    two = plan_sweep(sweep(tiers=["fp8=http://a:1", "bf16=http://b:1,model=m"], rollouts="2"))
    assert [c.name for c in two.cells] == ["fp8-none-r2", "bf16-none-r2"]
    assert two.cells[1].tier == Tier("bf16", "http://b:1", "m")


def test_toml_file_and_flag_override(tmp_path: Path) -> None:
    f = tmp_path / "sweep.toml"
    f.write_text(
        'benchmark = "gsm8k"\nout = "res"\nrollouts = [2, 4]\nmax_concurrent = ["none", 3]\n'
        "[params]\nseed = [1, 2]\nmax_tokens = 16\n"
        '[[tier]]\nname = "a"\ntarget = "http://a:1"\n'
        '[[tier]]\nname = "b"\ntarget = "http://b:1"\nmodel = "x"\n'
    )
    s = sweep(benchmark=None, config=f, out=None, rollouts="8")
    assert s.out == Path("res") and s.rollouts == [8] and s.max_concurrent == [None, 3]
    assert s.params == {"seed": [1, 2], "max_tokens": [16]}
    names = [c.name for c in plan_sweep(s).cells]
    assert names[0] == "a-none-r8-seed=1" and len(names) == 8


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(runtime="nosuch"), "unknown runtime 'nosuch'"),
        (dict(rollouts="0"), "is not a rollout count"),
        (dict(rollouts="4,x"), "is not a rollout count"),
        (dict(max_concurrent="0"), "is not a concurrency cap"),
        (dict(rollouts="4,4"), "listed twice"),
        (dict(params=["rollouts=3"]), "set it with --rollouts"),
        (dict(params=["temperature=9"]), "temperature"),
        (dict(params=["nosuch=1"]), "nosuch"),
        (dict(tiers=["fp8"]), "--tier expects"),
        (dict(tiers=["a=http://x", "a=http://y"]), "distinct"),
        (dict(tiers=["a=http://x"], target="http://y"), "not both"),
        (dict(benchmark="nosuch"), "unknown benchmark"),
    ],
)
def test_bad_input_is_a_usage_error(kw: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        plan_sweep(sweep(**kw))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rollouts = [", "not valid TOML"),
        ("rolouts = [4]", "unknown key 'rolouts'"),
        ("rollouts = []", "empty list"),
        ("[[tier]]\ntarget = 'http://x'", "needs a name"),
        ("params = 3", r"\[params\] must be a table"),
    ],
)
def test_bad_toml_is_a_usage_error(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text(text)
    with pytest.raises(UsageError, match=message):
        plan_sweep(sweep(config=f))


def test_only_selects_cells_by_glob() -> None:
    cells = plan_sweep(sweep(rollouts="2,4", max_concurrent="none,1")).cells
    assert [c.name for c in select(cells, ["*-c1"])] == ["none-r2-c1", "none-r4-c1"]
    with pytest.raises(UsageError, match="matches no cell"):
        select(cells, ["bwrap*"])


def test_tier_flag_parsing() -> None:
    assert parse_tier_flag("fp8=http://h:1/v1,model=q") == Tier("fp8", "http://h:1/v1", "q")
    with pytest.raises(UsageError, match="unknown option"):
        parse_tier_flag("fp8=http://h:1,key=1")
