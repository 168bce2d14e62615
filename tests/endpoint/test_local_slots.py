"""How the embedded llama-server is sized and found, without starting it: its slots follow the
run's concurrency within memory, and its command line turns batching, the prompt cache and
/metrics on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metrale.cli.matrix import widest
from metrale.cli.target import calls_in_flight
from metrale.endpoint import local
from metrale.errors import UsageError
from metrale.plugin import get_benchmark

PLENTY = 64 << 30  # 64 GiB available


@pytest.mark.parametrize("n", [1, 2, 4, 8, 13])
def test_one_slot_per_call_in_flight(n: int) -> None:
    slots, text = local.slots_for(n, PLENTY)
    assert slots == n
    assert text.startswith(f"{n} slot") and f"concurrency {n}" in text


def test_slots_are_capped_and_unbounded_concurrency_gets_the_cap() -> None:
    assert local.slots_for(500, PLENTY)[0] == local.MAX_SLOTS
    slots, text = local.slots_for(None, PLENTY)
    assert slots == local.MAX_SLOTS and "unbounded concurrency" in text


def test_memory_bounds_the_slots_and_the_log_says_so() -> None:
    memory = 3 * local.SLOT_BYTES * 4  # a quarter of it holds three slots
    slots, text = local.slots_for(8, memory)
    assert slots == 3
    assert "memory allows 3" in text and "queue" in text
    assert local.slots_for(8, 0)[0] == 1  # unknown memory: still one slot


def test_the_command_batches_caches_and_exports_metrics() -> None:
    server = local.LocalLlamaServer(parallel=4, n_ctx=1000)
    server.port = 1234
    argv = server.command(Path("/m.gguf"), Path("/bin/llama-server"))
    opt = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert opt["--parallel"] == "4" and opt["--ctx-size"] == "4000"  # 1,000 per slot
    assert {"--cont-batching", "--cache-prompt", "--metrics"} <= set(argv)
    assert opt["--alias"] == local.MODEL_NAME and opt["--host"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("benchmark", "params", "expected"),
    [
        ("gsm8k", {"max_concurrent": 6}, 6),
        ("gsm8k", {"rollouts": 3, "max_concurrent": 6}, 3),
        ("gsm8k", {"rollouts": 8}, 8),  # unbounded: as many as the rollouts
        ("serve", {"concurrency": 4}, 4),
        ("serve", {"load": "sweep", "sweep_concurrency": 32}, 32),
        ("serve", {"load": "rate", "rate": 2, "max_concurrency": 3}, 3),
        ("serve", {"load": "rate", "rate": 2}, None),
    ],
)
def test_each_benchmark_says_how_many_calls_it_makes_at_once(
    benchmark: str, params: dict[str, object], expected: int | None
) -> None:
    bench = get_benchmark(benchmark)()
    bench.configure(params)
    assert calls_in_flight(bench) == expected


def test_a_benchmark_that_says_nothing_gets_one_slot() -> None:
    assert calls_in_flight(object()) == 1


def test_a_sweeps_server_is_as_wide_as_its_widest_cell() -> None:
    assert widest([1, 8, 4]) == 8
    assert widest([1, None]) is None


def test_the_server_binary_is_found_or_named_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setattr(local.sys, "executable", str(tmp_path / "venv" / "python"))
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.delenv(local.SERVER_ENV, raising=False)
    assert local.server_binary() == fake  # on PATH
    beside = tmp_path / "venv" / "llama-server"
    beside.parent.mkdir()
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert local.server_binary() == beside  # beside the venv's python first
    monkeypatch.setenv(local.SERVER_ENV, str(fake))
    assert local.server_binary() == fake  # the variable wins
    monkeypatch.setenv(local.SERVER_ENV, str(tmp_path / "nothing"))
    with pytest.raises(UsageError, match=local.SERVER_ENV):
        local.server_binary()
    monkeypatch.delenv(local.SERVER_ENV)
    os.unlink(beside)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match=r"scripts/llama-server\.sh.* or pass --target"):
        local.server_binary()


AVX512_LINE = (
    "flags\t\t: fpu sse avx avx2 fma f16c avx512f avx512cd avx512bw avx512dq avx512vl avx512_vnni"
)


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_avx512_build_is_started_only_where_the_kernel_lists_every_instruction_it_uses(
    tmp_path: Path,
) -> None:
    portable = _executable(tmp_path / "llama-server")
    all_of_them = local.cpu_flags(_text(tmp_path / "cpuinfo", "processor\t: 0\n" + AVX512_LINE))
    assert all_of_them >= local.AVX512_FLAGS
    # no AVX-512 build installed: the portable one, whatever the CPU
    assert local.cpu_build(portable, all_of_them) == portable
    fast = _executable(tmp_path / local.AVX512_BINARY)
    assert local.cpu_build(portable, all_of_them) == fast
    # each instruction set missing on its own (a CPU without it, or a kernel that has not
    # enabled its registers and so does not list it): the portable build
    for flag in local.AVX512_FLAGS:
        assert local.cpu_build(portable, all_of_them - {flag}) == portable, flag
    assert local.cpu_build(portable, frozenset()) == portable
    fast.chmod(0o644)  # there but not executable
    assert local.cpu_build(portable, all_of_them) == portable


def test_cpu_flags_come_from_the_first_cpu_and_an_unreadable_file_gives_none(
    tmp_path: Path,
) -> None:
    two = "processor\t: 0\n" + AVX512_LINE + "\n\nprocessor\t: 1\nflags\t\t: fpu sse\n"
    assert "avx512_vnni" in local.cpu_flags(_text(tmp_path / "two", two))
    assert local.cpu_flags(tmp_path / "missing") == frozenset()
    assert local.cpu_flags(_text(tmp_path / "none", "processor\t: 0\n")) == frozenset()


def test_the_venvs_avx512_build_is_chosen_beside_it_and_the_variable_still_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beside = _executable(tmp_path / "venv" / "llama-server")
    fast = _executable(tmp_path / "venv" / local.AVX512_BINARY)
    monkeypatch.setattr(local.sys, "executable", str(tmp_path / "venv" / "python"))
    monkeypatch.delenv(local.SERVER_ENV, raising=False)
    monkeypatch.setattr(local, "cpu_flags", lambda: local.AVX512_FLAGS | {"sse"})
    assert local.server_binary() == fast
    monkeypatch.setattr(local, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    assert local.server_binary() == beside
    monkeypatch.setenv(local.SERVER_ENV, str(beside))
    monkeypatch.setattr(local, "cpu_flags", lambda: local.AVX512_FLAGS)
    assert local.server_binary() == beside  # a named binary is started as given


def test_a_server_on_path_gets_its_avx512_build_where_the_cpu_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = _executable(tmp_path / "bin" / "llama-server")
    monkeypatch.setattr(local.sys, "executable", str(tmp_path / "venv" / "python"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.delenv(local.SERVER_ENV, raising=False)
    monkeypatch.setattr(local, "cpu_flags", lambda: local.AVX512_FLAGS)
    assert local.server_binary() == on_path  # no AVX-512 build beside it
    fast = _executable(tmp_path / "bin" / local.AVX512_BINARY)
    assert local.server_binary() == fast
    monkeypatch.setattr(local, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    assert local.server_binary() == on_path


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
