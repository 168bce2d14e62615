"""The measuring client against a real `metrale sim` process."""

import asyncio
import time

import pytest

from metrale.endpoint.client import ChatClient, ClientOptions, EndpointError, Target

MESSAGES = [{"role": "user", "content": "hello there"}]


def chat(url: str, options: ClientOptions | None = None, **kw: object):
    async def go():
        async with ChatClient(Target(base_url=url, model="metrale-sim"), options) as client:
            return await client.chat(MESSAGES, **kw)

    return asyncio.run(go())


def test_streaming_with_usage(sim) -> None:
    call = chat(sim.url, record_chunks=True)
    assert call.content == "".join(f"tok{i} " for i in range(16))
    assert call.token_source == "usage"
    assert call.completion_tokens == 16
    assert call.prompt_tokens == 2
    assert call.finish_reason == "stop"
    assert call.retries == 0
    assert 0 < call.ttft_s <= call.latency_s
    assert len(call.chunk_times_s) == 16


def test_max_tokens_caps_and_finish_reason_says_length(sim) -> None:
    call = chat(sim.url, max_tokens=4)
    assert call.completion_tokens == 4
    assert call.finish_reason == "length"


def test_without_usage_tokens_are_counted_and_the_record_says_so(sim_factory) -> None:
    s = sim_factory("--no-usage", "--output-tokens", "7")
    call = chat(s.url)
    assert call.token_source == "counted"
    assert call.completion_tokens == 7
    assert call.prompt_tokens is None


def test_non_streaming(sim) -> None:
    call = chat(sim.url, ClientOptions(stream=False))
    assert call.completion_tokens == 16 and call.token_source == "usage"
    assert call.ttft_s == pytest.approx(call.latency_s, abs=0.05)


def test_timing_follows_the_simulated_delays(sim_factory) -> None:
    s = sim_factory("--ttft", "0.2", "--itl", "0.02", "--output-tokens", "6")
    call = chat(s.url)
    assert 0.19 <= call.ttft_s < 0.4
    assert 0.29 <= call.latency_s < 0.6


def test_5xx_is_retried_and_every_retry_counted(sim_factory) -> None:
    s = sim_factory("--error-rate", "1", "--error-kinds", "5xx")
    opts = ClientOptions(retries=3, backoff_base_s=0.01)
    with pytest.raises(EndpointError) as info:
        chat(s.url, opts)
    assert info.value.kind == "http_500"
    assert info.value.retries == 3


def test_zero_retries_lets_errors_show(sim_factory) -> None:
    s = sim_factory("--error-rate", "1", "--error-kinds", "5xx")
    with pytest.raises(EndpointError) as info:
        chat(s.url, ClientOptions(retries=0))
    assert info.value.retries == 0


def test_partial_failures_recover_through_retries(sim_factory) -> None:
    s = sim_factory("--error-rate", "0.5", "--error-kinds", "5xx,drop", "--seed", "3")
    opts = ClientOptions(retries=8, backoff_base_s=0.001)

    async def go():
        async with ChatClient(Target(base_url=s.url, model="metrale-sim"), opts) as client:
            return [await client.chat(MESSAGES) for _ in range(20)]

    calls = asyncio.run(go())
    assert all(c.completion_tokens == 16 for c in calls)
    assert sum(c.retries for c in calls) > 0


def test_dropped_connection_is_a_connection_error(sim_factory) -> None:
    s = sim_factory("--error-rate", "1", "--error-kinds", "drop")
    with pytest.raises(EndpointError) as info:
        chat(s.url, ClientOptions(retries=1, backoff_base_s=0.01))
    assert info.value.kind == "connection"
    assert info.value.retries == 1


def test_malformed_stream_is_not_retried(sim_factory) -> None:
    s = sim_factory("--error-rate", "1", "--error-kinds", "malformed")
    with pytest.raises(EndpointError) as info:
        chat(s.url, ClientOptions(retries=3))
    assert info.value.kind == "malformed_stream"
    assert info.value.retries == 0
    # the stream broke after a 200: the call record keeps the status it was answered with
    assert info.value.call is not None and info.value.call.status == 200


def test_timeout_is_recorded_not_retried(sim_factory) -> None:
    s = sim_factory("--ttft", "1.5")
    with pytest.raises(EndpointError) as info:
        chat(s.url, ClientOptions(request_timeout_s=0.3, retries=2))
    assert info.value.kind == "timeout"
    assert info.value.retries == 0


def test_unknown_model_is_a_4xx_without_retry(sim) -> None:
    async def go():
        async with ChatClient(Target(base_url=sim.url, model="nope")) as client:
            return await client.chat(MESSAGES)

    with pytest.raises(EndpointError) as info:
        asyncio.run(go())
    assert info.value.kind == "http_404" and info.value.retries == 0


def test_url_normalization() -> None:
    assert Target.normalize_url("http://h:8000") == "http://h:8000/v1"
    assert Target.normalize_url("http://h:8000/") == "http://h:8000/v1"
    assert Target.normalize_url("http://h:8000/v1/") == "http://h:8000/v1"
    assert Target.normalize_url("https://api.x.com/openai/v1") == "https://api.x.com/openai/v1"


def test_done_without_finish_reason_is_an_incomplete_stream() -> None:
    from metrale.endpoint.stream import CallFailed, StreamParser

    parser = StreamParser()
    parser.feed(b'data: {"choices": [{"delta": {"role": "assistant"}}]}', 0.1)
    parser.feed(b"data: [DONE]", 0.2)
    with pytest.raises(CallFailed) as info:
        parser.finish(200)
    assert info.value.kind == "incomplete_stream"


def test_streamed_calls_reuse_one_keep_alive_connection(sim) -> None:
    async def go():
        async with ChatClient(Target(base_url=sim.url, model="metrale-sim")) as client:
            first = await client.chat(MESSAGES)
            assert client._pool is not None and len(client._pool._idle) == 1
            conn = client._pool._idle[0]
            second = await client.chat(MESSAGES)
            assert client._pool._idle == [conn]
        # leaving the client closes what it kept open
        assert client._pool is None and conn.wire.sock.fileno() == -1 and not conn.reusable
        return first, second

    first, second = asyncio.run(go())
    assert first.completion_tokens == second.completion_tokens == 16


def test_a_call_record_starts_at_the_wall_clock_of_its_first_attempt(sim) -> None:
    before = time.time()
    call = chat(sim.url)
    assert before <= call.started_at <= time.time()


def test_a_client_outside_async_with_refuses_to_call() -> None:
    client = ChatClient(Target(base_url="http://127.0.0.1:9/v1", model="m"))

    async def go() -> None:
        await client.__aexit__(None, None, None)  # leaving a client never entered is harmless
        with pytest.raises(RuntimeError, match="outside 'async with'"):
            await client.chat(MESSAGES)

    asyncio.run(go())


def test_the_response_cap_follows_max_tokens_unless_set() -> None:
    opts = ClientOptions()
    assert opts.response_cap(10) == 16 * 1024 + 10 * 4 * 1024  # 57,344 bytes
    assert opts.response_cap(0) == 16 * 1024
    assert opts.response_cap(None) == 16 * 1024 * 1024
    assert ClientOptions(max_response_bytes=2048).response_cap(10) == 2048
    assert ClientOptions(max_response_bytes=0).response_cap(10) is None  # 0: no cap


def test_url_normalization_keeps_paths_and_strips_space() -> None:
    assert Target.normalize_url("  http://h:8000//  ") == "http://h:8000/v1"
    assert Target.normalize_url("http://h/openai") == "http://h/openai"
    assert Target.normalize_url("http://h/v") == "http://h/v"


def test_backoff_caps_retry_after_and_doubles_from_the_base() -> None:
    import random

    client = ChatClient(Target(base_url="http://127.0.0.1:9/v1", model="m"),
                        ClientOptions(backoff_base_s=1.0, backoff_max_s=5.0))  # fmt: skip

    class Top(random.Random):
        def random(self) -> float:
            return 0.0  # no jitter taken off: the cap itself

    client._rng = Top()
    assert [client._backoff(n, None) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert client._backoff(3, 0.5) == 0.5 and client._backoff(3, 9.0) == 5.0
