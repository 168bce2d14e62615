"""serve's load client and the chat client measure one request the same way: one transport,
one parser (`endpoint.stream`), against the real simulator on loopback.

Timing assertions are lower bounds the simulator guarantees (it cannot send before its sleep
ends) and generous upper bounds, never a few-ms window: the machine is shared and noisy.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from metrale.benchmarks.serve.client import StreamClient
from metrale.benchmarks.serve.metrics import RequestRecord
from metrale.endpoint.client import CallRecord, ChatClient, ClientOptions, Target
from tests.conftest import run_cli, start_sim, start_sim_config

MESSAGES = [{"role": "user", "content": "one two three"}]


def record() -> RequestRecord:
    return RequestRecord(level=0, index=0, phase="measure", intended_s=0.0, ready_s=0.0)


def both(
    url: str, options: ClientOptions | None = None, max_tokens: int = 16
) -> tuple[RequestRecord, CallRecord]:
    """One request through serve's client and one through the chat client, same target."""
    target = Target(base_url=url, model="metrale-sim")

    async def go() -> tuple[RequestRecord, CallRecord]:
        rec = record()
        async with StreamClient(target, options) as serve:
            body = {"model": target.model, "messages": MESSAGES, "max_tokens": max_tokens}
            await serve.send(serve.prepare(body), rec, time.perf_counter())
        async with ChatClient(target, options) as chat:
            call = await chat.chat(MESSAGES, max_tokens=max_tokens, record_chunks=True)
        return rec, call

    return asyncio.run(go())


def test_ttft_counts_from_the_send_not_the_headers_in_both_clients() -> None:
    """The sim holds its headers 0.3 s and its first token until 0.4 s after arrival."""
    with start_sim_config(ttft_s=0.4, header_delay_s=0.3, itl_s=0.05, output_tokens=4) as s:
        rec, call = both(s.url)
    assert rec.error is None, rec.error
    for ttft, e2e, times in ((rec.ttft_s, rec.e2e_s, rec.chunk_times_s),
                             (call.ttft_s, call.latency_s, call.chunk_times_s)):  # fmt: skip
        assert ttft is not None and e2e is not None and times is not None
        assert 0.4 <= ttft < 3.0  # from the headers it would read about 0.1 s
        assert e2e >= 0.4 + 3 * 0.05 and e2e >= times[-1]
        assert len(times) == 4 and times[0] == ttft and times == sorted(times)
    assert (rec.output_tokens, rec.token_source) == (call.completion_tokens, call.token_source)
    assert (rec.output_tokens, rec.token_source, rec.prompt_tokens) == (4, "usage", 3)
    assert rec.ttfc_s == rec.ttft_s and rec.chunk_tokens == [1.0] * 4
    assert rec.send_s is not None and rec.end_s is not None and rec.end_s >= rec.send_s + 0.4


def test_a_server_without_usage_gives_counted_tokens_in_both() -> None:
    with start_sim("--output-tokens", "5", "--no-usage") as s:
        rec, call = both(s.url)
    assert (rec.output_tokens, rec.token_source) == (5, "counted")
    assert (call.completion_tokens, call.token_source) == (5, "counted")
    assert rec.prompt_tokens is None and call.prompt_tokens is None


def test_no_stream_is_one_chunk_whose_ttft_is_its_e2e_in_both() -> None:
    with start_sim("--ttft", "0.2", "--output-tokens", "6") as s:
        rec, call = both(s.url, ClientOptions(stream=False))
    assert rec.error is None, rec.error
    assert rec.ttft_s is not None and rec.ttft_s >= 0.2
    assert rec.ttft_s == rec.e2e_s == rec.ttfc_s and rec.chunk_times_s == [rec.ttft_s]
    assert (rec.output_tokens, rec.token_source, rec.chunk_tokens) == (6, "usage", [6.0])
    assert call.ttft_s is not None and call.ttft_s >= 0.2 and call.ttft_s == call.latency_s
    assert (call.completion_tokens, call.token_source) == (6, "usage")


def test_a_response_over_the_cap_fails_as_response_too_large() -> None:
    with start_sim("--output-tokens", "200") as s:
        target = Target(base_url=s.url, model=s.model)

        async def go() -> RequestRecord:
            rec = record()
            async with StreamClient(target, ClientOptions(max_response_bytes=2048)) as c:
                body = {"model": target.model, "messages": MESSAGES, "max_tokens": 200}
                await c.send(c.prepare(body), rec, time.perf_counter())
            return rec

        rec = asyncio.run(go())
    assert rec.error is not None and rec.error.startswith("response_too_large: "), rec.error
    assert rec.status == 200 and rec.e2e_s is None and not rec.ok


def test_the_cap_follows_max_tokens_as_in_the_chat_client() -> None:
    client = StreamClient(Target(base_url="http://127.0.0.1:9/v1", model="m"))
    prepared = client.prepare({"model": "m", "max_tokens": 10, "stream": False})
    assert prepared.cap == ClientOptions().response_cap(10)
    assert json.loads(prepared.body)["stream"] is True  # options.stream, not the caller, decides
    off = StreamClient(client.target, ClientOptions(stream=False, max_response_bytes=0))
    prepared = off.prepare({"model": "m"})
    assert prepared.cap is None and json.loads(prepared.body) == {"model": "m", "stream": False}


def test_a_timeout_and_an_http_error_are_recorded_not_raised_nor_retried() -> None:
    with (
        start_sim("--ttft", "1.5") as slow,
        start_sim("--error-rate", "1", "--error-kinds", "5xx") as broken,
    ):
        target = Target(base_url=slow.url, model=slow.model)

        async def go(url: str, options: ClientOptions) -> RequestRecord:
            rec = record()
            async with StreamClient(Target(base_url=url, model=target.model), options) as c:
                await c.send(c.prepare({"model": target.model, "messages": MESSAGES}), rec, 0.0)
            return rec

        late = asyncio.run(go(slow.url, ClientOptions(request_timeout_s=0.3)))
        failed = asyncio.run(go(broken.url, ClientOptions(retries=5, backoff_base_s=0.001)))
        stats = _stats(broken.url)
    assert late.error == "timeout: no complete response within 0.3 s"
    assert late.end_s is not None and late.send_s is not None and late.end_s - late.send_s < 1.5
    assert failed.status == 500 and failed.error is not None
    assert failed.error.startswith("http_500: HTTP 500: ")
    assert stats["requests"] == 1  # `retries` is the chat client's: serve never retries


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/sim/stats", timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_sequential_requests_reuse_one_keep_alive_connection() -> None:
    with start_sim("--output-tokens", "3") as s:
        target = Target(base_url=s.url, model=s.model)

        async def go() -> tuple[list[RequestRecord], int]:
            async with StreamClient(target) as c:
                request = c.prepare({"model": target.model, "messages": MESSAGES})
                recs = [record() for _ in range(5)]
                for rec in recs:
                    await c.send(request, rec, 0.0)
                return recs, len(c.pool._idle)

        recs, idle = asyncio.run(go())
    assert all(r.error is None for r in recs) and idle == 1


# --------------------------------------------------------------------------- through the CLI


def serve(url: str, out: Path, *flags: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    proc = run_cli(["run", "serve", "--target", url, "--no-preflight", "--out", str(out), *flags])
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())["result"]
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return result, rows


def test_cli_no_stream_serve_records_ttft_equal_to_e2e(tmp_path: Path) -> None:
    with start_sim("--output-tokens", "4", "--ttft", "0.02") as s:
        result, rows = serve(s.url, tmp_path, "--no-stream", "--concurrency", "2",
                             "--requests", "6", "--max-tokens", "4")  # fmt: skip
    m = result["metrics"]
    assert m["requests"] == 6 and m["errors"] == 0 and m["output_tokens_mean"] == 4
    measured = [r for r in rows if r["phase"] == "measure"]
    assert len(measured) == 6
    for r in measured:
        assert r["ttft_s"] == r["e2e_s"] >= 0.02 and r["chunk_times_s"] == [r["ttft_s"]]
    assert m["ttft_ms_p50"] == m["e2e_ms_p50"]
    assert json.loads((tmp_path / "run.json").read_text())["client"]["stream"] is False


def test_cli_request_timeout_and_response_cap_apply_to_serve(tmp_path: Path) -> None:
    with start_sim("--ttft", "1.0", "--output-tokens", "400") as s:
        _, late = serve(s.url, tmp_path / "a", "--request-timeout", "0.2", "--requests", "2",
                        "--concurrency", "1", "--max-error-rate", "none")  # fmt: skip
        _, big = serve(s.url, tmp_path / "b", "--max-response-kb", "1", "--requests", "2",
                       "--concurrency", "1", "--max-tokens", "400",
                       "--max-error-rate", "none")  # fmt: skip
    assert [r["error"] for r in late if r["phase"] == "measure"] == [
        "timeout: no complete response within 0.2 s"
    ] * 2
    assert all(r["error"].startswith("response_too_large") for r in big), big
    gone = run_cli(["run", "serve", "--target", s.url, "--request-timeout-s", "3"], timeout=60)
    assert gone.returncode == 2 and "Traceback" not in gone.stderr
