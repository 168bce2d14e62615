"""Issue 21 item 8: every bad number is refused before work, one line naming the field and the
accepted range, wherever it comes from: a flag of any command, a runtime option, a benchmark
parameter, task.toml, a budgets file, client options. The flags and fields are found by walking
the parsers and the configs, not listed by hand, so that a new one cannot skip the check."""

from __future__ import annotations

import argparse
import math
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale.benchmarks.terminal_bench.task import load_task
from metrale.cli import build_parser
from metrale.errors import UsageError
from metrale.plugin import discover
from tests.benchmarks.terminal_bench.helpers import write_task
from tests.conftest import run_cli

NON_FINITE = ("nan", "inf", "-inf", "1e400")
#: ... and a number no field means (an int flag took it whole: a 10^20 MB file size limit)
ABSURD = "99999999999999999999"


def _number_flags() -> Iterator[tuple[str, str, argparse.Action]]:
    """(command, flag, action) of every flag whose type reads a number, in every command of
    the parser, with every benchmark's own flags too."""
    parsers = [build_parser()] + [build_parser(bench) for bench in discover().values()]
    for parser in parsers:
        for sub in parser._subparsers._group_actions:  # type: ignore[union-attr]
            for command, p in sub.choices.items():  # type: ignore[union-attr]
                for action in p._actions:
                    if not action.option_strings or action.type in (None, str, Path):
                        continue
                    for probe in ("64", "0.5"):
                        try:
                            value = action.type(probe)  # type: ignore[operator]
                        except (argparse.ArgumentTypeError, UsageError, ValueError):
                            continue
                        if isinstance(value, int | float) and not isinstance(value, bool):
                            yield command, action.option_strings[-1], action
                        break


FLAGS = sorted({(c, f): a for c, f, a in _number_flags()}.items())


def test_the_walk_finds_the_number_flags() -> None:
    names = {flag for (_, flag), _ in FLAGS}
    assert {"--timeout", "--memory-mb", "--max-procs", "--ttft", "--error-rate"} <= names
    assert len(FLAGS) >= 25


@pytest.mark.parametrize(("where", "action"), FLAGS, ids=[f"{c}{f}" for (c, f), _ in FLAGS])
def test_every_number_flag_refuses_nan_infinities_and_absurd(
    where: tuple[str, str], action: argparse.Action
) -> None:
    for text in (*NON_FINITE, ABSURD):
        with pytest.raises((argparse.ArgumentTypeError, UsageError, ValueError)):
            value = action.type(text)  # type: ignore[operator]
            pytest.fail(f"{where[0]} {where[1]} {text} was taken as {value!r}")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["exec", "--runtime", "subprocess", "--timeout", "nan", "--", "true"], "--timeout"),
        (["exec", "--runtime", "bwrap", "--memory-mb", "0", "--", "true"], "--memory-mb"),
        (["exec", "--runtime", "bwrap", "--max-procs", "0", "--", "true"], "--max-procs"),
        (
            ["exec", "--runtime", "subprocess", "--file-size-mb", "99999999999999", "--", "true"],
            "--file-size-mb",
        ),
        (["exec", "--runtime", "docker", "--max-procs", "1", "--", "true"], "--max-procs"),
        (["sim", "--ttft", "nan"], "--ttft"),
        (["sim", "--itl", "inf"], "--itl"),
        (["sim", "--header-delay", "nan"], "--header-delay"),
        (["sim", "--error-rate", "nan"], "--error-rate"),
        (["sim", "--token-budget", "inf"], "--token-budget"),
        (["run", "gsm8k", "--request-timeout", "nan"], "--request-timeout"),
        (["run", "gsm8k", "--temperature", "nan"], "temperature"),
        (["matrix", "gsm8k", "--runtime-rate", "inf"], "--runtime-rate"),
        (["compare", "a", "b", "--tolerance", "nan"], "--tolerance"),
    ],
)
def test_bad_numbers_are_one_line_before_work(args: list[str], flag: str) -> None:
    proc = run_cli(args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "accepted" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def _bench_number_params() -> Iterator[tuple[str, object]]:
    for bench_id, cls in discover().items():
        for spec in cls().parameters():
            if spec.type in ("int", "float"):
                yield f"{bench_id}.{spec.name}", spec


@pytest.mark.parametrize(("name", "spec"), list(_bench_number_params()))
def test_every_benchmark_parameter_refuses_nan_and_infinities(name: str, spec: object) -> None:
    for raw in (*NON_FINITE, math.nan, math.inf, -math.inf, 1e300):
        with pytest.raises(UsageError, match=name.split(".", 1)[1]):
            spec.coerce(raw)  # type: ignore[attr-defined]


def _numeric_runtime_options() -> Iterator[tuple[str, str]]:
    from metrale.runtime.configs import runtime_config
    from metrale.runtime.registry import config_classes

    for name, cls in config_classes().items():
        for key in cls.flat_keys():
            for probe in (64, 1.5):
                try:
                    runtime_config(name, **{key: probe})
                except Exception:  # not a number option (a wrong type is tested below)
                    continue
                yield name, key
                break


RUNTIME_OPTIONS = sorted(set(_numeric_runtime_options()))


def test_the_walk_finds_the_runtime_limits() -> None:
    found = set(RUNTIME_OPTIONS)
    assert {("docker", "max_procs"), ("docker", "cpus"), ("bwrap", "memory_mb")} <= found


@pytest.mark.parametrize(("runtime", "key"), RUNTIME_OPTIONS)
def test_every_numeric_runtime_option_refuses_nan_infinities_and_absurd(
    runtime: str, key: str
) -> None:
    from metrale.runtime.configs import runtime_config

    for bad in (math.nan, math.inf, -math.inf, -1, 10**20):
        with pytest.raises(UsageError, match=key):
            runtime_config(runtime, **{key: bad})


def test_a_bind_list_of_the_wrong_type_is_a_usage_error() -> None:
    from metrale.runtime.configs import runtime_config

    for bad in (3, "/etc", [1]):
        with pytest.raises(UsageError, match="ro_binds"):
            runtime_config("bwrap", ro_binds=bad)


def test_docker_refuses_a_pids_limit_nothing_can_run_under() -> None:
    from metrale.runtime.configs import runtime_config

    with pytest.raises(UsageError, match="max_procs"):
        runtime_config("docker", max_procs=1)


TASK_FIELDS = [
    ("agent", "timeout_sec"),
    ("verifier", "timeout_sec"),
    ("environment", "build_timeout_sec"),
    ("environment", "cpus"),
    ("environment", "memory_mb"),
    ("environment", "storage_mb"),
]


def _with(toml_text: str, section: str, key: str, value: str) -> str:
    data = tomllib.loads(toml_text)
    lines = [line for line in toml_text.splitlines() if not line.startswith(f"{key} =")]
    text = "\n".join(lines)
    if section in data:
        return text.replace(f"[{section}]", f"[{section}]\n{key} = {value}", 1)
    return text + f"\n[{section}]\n{key} = {value}\n"


@pytest.mark.parametrize(("section", "key"), TASK_FIELDS)
def test_every_numeric_task_toml_field_is_bounded(tmp_path: Path, section: str, key: str) -> None:
    task = write_task(tmp_path)
    toml = task / "task.toml"
    good = toml.read_text()
    if key == "memory_mb":
        good = "\n".join(line for line in good.splitlines() if not line.startswith("memory ="))
    for value in ("nan", "inf", "-inf", "0", "-1", "1e300", '"soon"', "true"):
        toml.write_text(_with(good, section, key, value))
        with pytest.raises(UsageError) as caught:
            load_task(str(task))
        line = str(caught.value)
        assert "task.toml" in line and key in line and "accepted" in line, (value, line)
        assert "\n" not in line


def test_a_task_memory_no_shell_can_run_in_is_refused(tmp_path: Path) -> None:
    task = write_task(tmp_path)
    toml = task / "task.toml"
    good = toml.read_text()
    for line_in in ('memory = "1K"', 'memory = "1M"'):
        toml.write_text(good.replace('memory = "512M"', line_in))
        with pytest.raises(UsageError, match="memory"):
            load_task(str(task))
    toml.write_text(good.replace('memory = "512M"', "memory_mb = 1"))
    with pytest.raises(UsageError, match="memory_mb = 1 is out of range; accepted"):
        load_task(str(task))


def test_budgets_refuse_nan_and_infinities(tmp_path: Path) -> None:
    from metrale.budgets import load_budgets

    for value in ("nan", "inf", "-inf"):
        path = tmp_path / "BENCH.toml"
        path.write_text(f"[gsm8k]\nreward_mean_min = {value}\n")
        with pytest.raises(UsageError, match="reward_mean_min"):
            load_budgets(path, "gsm8k")


def test_client_options_refuse_nan_and_infinities() -> None:
    from pydantic import ValidationError

    from metrale.endpoint.client import ClientOptions

    for field in ("request_timeout_s", "backoff_base_s", "backoff_max_s"):
        for bad in (math.nan, math.inf, -1.0):
            with pytest.raises(ValidationError, match=field):
                ClientOptions(**{field: bad})  # type: ignore[arg-type]
