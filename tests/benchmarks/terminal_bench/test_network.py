"""A rollout's network follows its task's `allow_internet` exactly, whatever the flags: off, no
network; on, the network the runtime gives (docker: `--docker-network`, else the engine's
bridge; bwrap: the host's network namespace). A runtime that cannot follow a task's setting
refuses that task: one line for one task, a skipped row in a dataset. Without running
anything; the real sandboxes are test_network_runs.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from metrale.benchmarks.terminal_bench import prepare
from metrale.benchmarks.terminal_bench.benchmark import TerminalBenchBenchmark
from metrale.errors import UsageError
from metrale.runtime.base import Capability, TaskSandbox
from metrale.runtime.bwrap import BwrapConfig
from metrale.runtime.docker import DockerConfig
from tests.benchmarks.terminal_bench.helpers import write_task


def internet(task: Path, allowed: bool) -> Path:
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace(
        "allow_internet = false", f"allow_internet = {'true' if allowed else 'false'}"
    ))  # fmt: skip
    return task


@pytest.mark.parametrize(
    ("given", "allowed", "expected"),
    [
        ("none", False, "none"),
        ("none", True, "bridge"),  # the default meant no network for sandboxes needing none
        ("host", False, "none"),  # off whatever the flags
        ("mynet", True, "mynet"),  # the user's network for the tasks that allow one
    ],
)
def test_docker_gives_a_task_the_network_its_allow_internet_says(
    given: str, allowed: bool, expected: str
) -> None:
    config = DockerConfig(network=given).for_task(TaskSandbox(image="x", internet=allowed))
    assert isinstance(config, DockerConfig) and config.network == expected
    assert f"--network {expected}" in " ".join(config.create().run_argv())  # type: ignore[attr-defined]


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("allowed", [False, True])
def test_bwrap_shares_the_host_network_exactly_when_the_task_allows_the_internet(
    given: bool, allowed: bool
) -> None:
    config = BwrapConfig(network=given).for_task(TaskSandbox(internet=allowed))
    assert isinstance(config, BwrapConfig) and config.network is allowed


@pytest.mark.parametrize("service", ["modal", "prime"])
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("allowed", [False, True])
def test_a_remote_sandbox_has_its_network_exactly_when_the_task_allows_the_internet(
    service: str, given: bool, allowed: bool
) -> None:
    """modal's `block_network`, prime's `network_allowlist=[]`: both from `network`."""
    from metrale.runtime.modal import ModalConfig
    from metrale.runtime.prime import PrimeConfig

    kind = {"modal": ModalConfig, "prime": PrimeConfig}[service]
    config = kind(network=given).for_task(TaskSandbox(internet=allowed))
    assert isinstance(config, ModalConfig | PrimeConfig) and config.network is allowed


class NoNetwork(DockerConfig):
    """A task-image runtime that can cut the network but give none."""

    capabilities: ClassVar[frozenset[Capability]] = DockerConfig.capabilities - {Capability.NETWORK}


class AlwaysNetwork(DockerConfig):
    """One whose sandboxes always have a network (no `network_off`)."""

    capabilities: ClassVar[frozenset[Capability]] = DockerConfig.capabilities - {
        Capability.NETWORK_OFF
    }


def configured(spec: Path, **values: Any) -> TerminalBenchBenchmark:
    bench = TerminalBenchBenchmark()
    bench.configure({"task": str(spec), "agent": "oracle", **values})
    return bench


def test_a_runtime_that_cannot_follow_allow_internet_skips_that_task_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepare, "check_engine", lambda *a: None)
    data = tmp_path / "data"
    data.mkdir()
    write_task(data, "offline")
    internet(write_task(data, "online"), True)
    bench = configured(data, attempts=2)
    assert bench.values["rollouts"] == 4
    bench.runtime_choice(NoNetwork())
    assert [r.task.name for r in bench.runs] == ["offline"] and bench.values["rollouts"] == 2
    assert bench.tally is not None
    skipped = {t.name: t.skipped for t in bench.tally.summaries()}
    assert skipped == {
        "offline": None,
        "online": "task online: task.toml [environment] allow_internet = true: the docker "
        "runtime cannot give a sandbox a network",
    }
    bench = configured(data)
    bench.runtime_choice(AlwaysNetwork())
    assert [r.task.name for r in bench.runs] == ["online"]
    with pytest.raises(UsageError, match="^--strict: task online: .* cannot give a sandbox"):
        configured(data, strict=True).runtime_choice(NoNetwork())
    with pytest.raises(UsageError, match="no task of .* can run on docker; the first: task on"):
        configured(data, tasks="online").runtime_choice(NoNetwork())
    with pytest.raises(UsageError, match="^task offline: .* allow_internet = false: the docker "
                       "runtime cannot cut a sandbox off the network$"):  # fmt: skip
        configured(data / "offline").runtime_choice(AlwaysNetwork())
    for runtime in (DockerConfig(), BwrapConfig()):  # both follow either setting
        bench = configured(data)
        bench.runtime_choice(runtime)
        assert len(bench.runs) == 2
