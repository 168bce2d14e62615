"""The client's numbers (TTFT, latency, tokens, retries) against servers whose every byte and
every delay the test sets: a loopback aiohttp server written here, and the real simulator with
its headers held back, so that send, headers and first token are three distinct times.

Timing assertions are lower bounds the server guarantees (it cannot send before its sleep ends)
and generous upper bounds, never a few-ms window: the machine is shared and noisy.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from aiohttp import web

from metrale.endpoint.client import CallRecord, ChatClient, ClientOptions, EndpointError, Target
from tests.conftest import start_sim_config

MESSAGES = [{"role": "user", "content": "hello there"}]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    """A loopback server answering POST /v1/chat/completions with `handler`."""

    async def route(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", route)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def sse(*parts: bytes | float, seen: list[dict[str, Any]] | None = None) -> Handler:
    """Stream `parts` in order: bytes are written as they are, a float is a sleep (seconds)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if seen is not None:
            seen.append({"body": body, "auth": request.headers.get("Authorization")})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for part in parts:
            if isinstance(part, float):
                await asyncio.sleep(part)
            else:
                await resp.write(part)
        await resp.write_eof()
        return resp

    return handler


def data(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    chunk: dict[str, Any] = {"choices": [{"index": 0, "delta": delta or {},
                                          "finish_reason": finish}]}  # fmt: skip
    chunk.update(extra)
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def call(
    handler: Handler,
    options: ClientOptions | None = None,
    api_key: str | None = None,
    **kw: Any,
) -> CallRecord:
    async def go() -> CallRecord:
        async with serve(handler) as url:
            target = Target(base_url=url, model="m", api_key=api_key)
            async with ChatClient(target, options) as client:
                return await client.chat(MESSAGES, **kw)

    return asyncio.run(go())


def failure(handler: Handler, options: ClientOptions | None = None) -> EndpointError:
    with pytest.raises(EndpointError) as info:
        call(handler, options)
    return info.value


# --------------------------------------------------------------------------- TTFT and latency


def test_ttft_counts_from_the_send_not_from_the_response_headers() -> None:
    """The sim holds its headers 0.3 s and its first token until 0.4 s after arrival."""
    with start_sim_config(ttft_s=0.4, header_delay_s=0.3, itl_s=0.05, output_tokens=4) as s:

        async def go() -> CallRecord:
            async with ChatClient(Target(base_url=s.url, model=s.model)) as client:
                return await client.chat(MESSAGES, record_chunks=True)

        record = asyncio.run(go())
    assert record.ttft_s is not None and record.latency_s is not None
    assert 0.4 <= record.ttft_s < 3.0  # from headers it would read about 0.1 s
    assert record.latency_s >= 0.4 + 3 * 0.05
    assert record.chunk_times_s is not None and len(record.chunk_times_s) == 4
    assert record.chunk_times_s[0] == record.ttft_s
    assert record.chunk_times_s == sorted(record.chunk_times_s)
    assert record.latency_s >= record.chunk_times_s[-1]


def test_chunks_without_output_do_not_start_the_clock_or_count() -> None:
    record = call(
        sse(data({"role": "assistant"}), b": keep-alive\n\n", 0.3, data({"content": ""}),
            data({"content": "a"}), 0.2, data({"content": "b"}, "stop"), DONE),
        record_chunks=True,
    )  # fmt: skip
    assert record.ttft_s is not None and record.latency_s is not None
    assert record.ttft_s >= 0.3
    assert record.latency_s >= record.ttft_s + 0.2
    assert record.chunk_times_s is not None and len(record.chunk_times_s) == 2
    assert (record.content, record.completion_tokens, record.token_source) == ("ab", 2, "counted")
    assert record.prompt_tokens is None and record.finish_reason == "stop"


def test_reasoning_and_tool_call_deltas_are_output() -> None:
    record = call(sse(
        0.2,
        data({"reasoning_content": "think "}),
        data({"reasoning": "more"}),
        data({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "ba"}}]}),
        data({"tool_calls": [{"index": 0, "function": {"name": "sh", "arguments": '{"c'}}]}),
        data({"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "ls"}}]}),
        data({"tool_calls": [{"index": 0, "function": {"arguments": 'md": 1}'}}]}, "tool_calls"),
        DONE,
    ))  # fmt: skip
    assert record.ttft_s is not None and record.ttft_s >= 0.2
    assert record.reasoning == "think more" and record.content == ""
    assert [(t.id, t.name, t.arguments) for t in record.tool_calls] == [
        ("c1", "bash", '{"cmd": 1}'), ("c2", "ls", "")
    ]  # fmt: skip
    assert (record.completion_tokens, record.token_source) == (6, "counted")
    assert record.finish_reason == "tool_calls"


def test_server_usage_wins_over_the_count() -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 40, "total_tokens": 51}
    record = call(sse(data({"content": "a"}), data({"content": "b"}, "length"),
                      b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n",
                      DONE))  # fmt: skip
    assert (record.prompt_tokens, record.completion_tokens, record.token_source) == (
        11, 40, "usage"
    )  # fmt: skip
    assert record.finish_reason == "length" and record.content == "ab"


def test_events_split_across_reads_and_crlf_line_ends_parse() -> None:
    frame = data({"content": "hello"})
    record = call(sse(frame[:9], 0.05, frame[9:], data({"content": " you"}, "stop").replace(
        b"\n", b"\r\n"), b"event: x\r\nid: 3\r\n\r\n", DONE))  # fmt: skip
    assert record.content == "hello you" and record.completion_tokens == 2


def test_a_stream_that_ends_with_a_finish_reason_but_no_done_is_complete() -> None:
    record = call(sse(data({"content": "x"}), 0.1, data({}, "stop")))
    assert record.content == "x" and record.finish_reason == "stop"
    assert record.latency_s is not None and record.latency_s >= 0.1


def test_the_request_body_says_what_was_asked() -> None:
    seen: list[dict[str, Any]] = []
    call(sse(data({"content": "x"}, "stop"), DONE, seen=seen), api_key="sk-1", max_tokens=5,
         temperature=0.0, seed=7, tools=[{"type": "function"}], extra={"top_k": 3})  # fmt: skip
    [req] = seen
    assert req["auth"] == "Bearer sk-1"
    assert req["body"] == {
        "model": "m", "messages": MESSAGES, "max_tokens": 5, "temperature": 0.0, "seed": 7,
        "tools": [{"type": "function"}], "stream": True,
        "stream_options": {"include_usage": True}, "top_k": 3,
    }  # fmt: skip
    seen.clear()
    call(sse(data({"content": "x"}, "stop"), DONE, seen=seen))
    assert seen[0]["auth"] is None
    assert seen[0]["body"] == {"model": "m", "messages": MESSAGES, "stream": True,
                               "stream_options": {"include_usage": True}}  # fmt: skip


# --------------------------------------------------------------------------- non-streaming


def json_reply(payload: Any, delay_s: float = 0.0, status: int = 200, **headers: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(delay_s)
        text = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
        return web.Response(text=text, status=status, content_type="application/json",
                            headers=headers)  # fmt: skip

    return handler


def test_a_json_body_is_read_whole_and_its_ttft_is_its_latency() -> None:
    body = {
        "choices": [{"message": {"content": "four", "reasoning_content": "2+2",
                                 "tool_calls": [{"id": "t", "function": {"name": "f",
                                                                         "arguments": "{}"}}]},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }  # fmt: skip
    record = call(json_reply(body, delay_s=0.3), ClientOptions(stream=False))
    assert record.ttft_s is not None and record.latency_s is not None
    assert record.ttft_s >= 0.3 and record.latency_s >= record.ttft_s
    assert record.latency_s - record.ttft_s < 0.5
    assert (record.content, record.reasoning, record.finish_reason) == ("four", "2+2", "stop")
    assert (record.prompt_tokens, record.completion_tokens, record.token_source) == (3, 1, "usage")
    assert [(t.id, t.name, t.arguments) for t in record.tool_calls] == [("t", "f", "{}")]
    assert record.status == 200 and record.retries == 0


def test_a_json_body_without_usage_has_no_token_source() -> None:
    record = call(json_reply({"choices": [{"message": {"content": "x"}}]}),
                  ClientOptions(stream=False))  # fmt: skip
    assert (record.completion_tokens, record.token_source, record.content) == (None, None, "x")
    # A server that ignores "stream" and answers JSON is read as JSON.
    record = call(json_reply({"choices": [{"message": {"content": "y"}, "finish_reason": "stop"}]}))
    assert record.content == "y" and record.finish_reason == "stop"


@pytest.mark.parametrize(
    ("payload", "kind"),
    [("not json", "malformed_response"), ({"choices": "x"}, "malformed_response"),
     ([1, 2], "malformed_response")],
)  # fmt: skip
def test_a_bad_json_body_is_malformed_and_not_retried(payload: Any, kind: str) -> None:
    err = failure(json_reply(payload), ClientOptions(stream=False, retries=3))
    assert err.kind == kind and err.retries == 0


# --------------------------------------------------------------------------- failures and retries


@pytest.mark.parametrize(
    ("parts", "kind"),
    [
        ((b"data: {not json\n\n",), "malformed_stream"),
        ((b"data: [1, 2]\n\n",), "malformed_stream"),
        ((b'data: {"error": {"message": "overloaded"}}\n\n',), "stream_error"),
        ((data({"content": "x"}), DONE), "incomplete_stream"),
    ],
)
def test_broken_streams_are_not_retried(parts: Sequence[bytes], kind: str) -> None:
    err = failure(sse(*parts), ClientOptions(retries=3, backoff_base_s=0.001))
    assert err.kind == kind and err.retries == 0
    assert err.call is not None and err.call.error_kind == kind


def test_a_stream_cut_before_its_end_is_a_retried_connection_error() -> None:
    err = failure(sse(data({"content": "x"})), ClientOptions(retries=2, backoff_base_s=0.001))
    assert err.kind == "connection" and err.retries == 2
    assert err.call is not None and err.call.retries == 2


class Flaky:
    """Answer `statuses` in turn (then 200 with a one-token stream), counting the requests."""

    def __init__(self, *statuses: int, retry_after: str | None = None) -> None:
        self.statuses, self.retry_after, self.requests = list(statuses), retry_after, 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests += 1
        if self.statuses:
            status = self.statuses.pop(0)
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return web.Response(text="busy", status=status, headers=headers)
        return await sse(data({"content": "ok"}, "stop"), DONE)(request)


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_429_and_5xx_are_retried_and_counted(status: int) -> None:
    flaky = Flaky(status, status)
    record = call(flaky, ClientOptions(retries=2, backoff_base_s=0.001))
    assert record.content == "ok" and record.retries == 2 and flaky.requests == 3


@pytest.mark.parametrize("status", [400, 401, 404, 422, 499])
def test_other_4xx_are_not_retried(status: int) -> None:
    flaky = Flaky(status)
    err = failure(flaky, ClientOptions(retries=3, backoff_base_s=0.001))
    assert err.kind == f"http_{status}" and err.retries == 0 and flaky.requests == 1
    assert err.call is not None and err.call.status == status
    assert str(err) == f"HTTP {status}: busy"


def test_retries_stop_at_the_limit_and_the_error_keeps_the_last_status() -> None:
    flaky = Flaky(503, 503, 503, 503)
    err = failure(flaky, ClientOptions(retries=2, backoff_base_s=0.001))
    assert err.kind == "http_503" and err.retries == 2 and flaky.requests == 3
    assert err.call is not None and err.call.status == 503 and err.call.error_kind == "http_503"


def test_retry_after_is_honoured_up_to_the_backoff_cap() -> None:
    flaky = Flaky(429, retry_after="0.4")
    started = time.perf_counter()
    record = call(flaky, ClientOptions(retries=1, backoff_base_s=0.0, backoff_max_s=8.0))
    assert record.retries == 1 and time.perf_counter() - started >= 0.4
    capped = Flaky(429, 429, retry_after="3600")
    started = time.perf_counter()
    record = call(capped, ClientOptions(retries=2, backoff_max_s=0.05))
    assert record.retries == 2 and time.perf_counter() - started < 30
    garbled = Flaky(429, retry_after="soon")
    assert call(garbled, ClientOptions(retries=1, backoff_base_s=0.001)).retries == 1


def test_backoff_is_full_jitter_under_a_doubling_cap() -> None:
    client = ChatClient(Target(base_url="http://127.0.0.1:9/v1", model="m"),
                        ClientOptions(backoff_base_s=0.25, backoff_max_s=8.0))  # fmt: skip
    client._rng = random.Random(1)
    for attempt, cap in ((1, 0.25), (2, 0.5), (3, 1.0), (6, 8.0), (9, 8.0)):
        draws = [client._backoff(attempt, None) for _ in range(300)]
        assert 0 <= min(draws) < cap / 10 and cap * 0.9 < max(draws) <= cap
    assert client._backoff(1, 2.5) == 2.5
    assert client._backoff(1, 100.0) == 8.0


def test_a_timeout_is_recorded_and_not_retried() -> None:
    flaky = Flaky()

    async def slow(request: web.Request) -> web.StreamResponse:
        flaky.requests += 1
        return await sse(1.5, data({"content": "late"}, "stop"), DONE)(request)

    err = failure(slow, ClientOptions(request_timeout_s=0.3, retries=2))
    assert err.kind == "timeout" and err.retries == 0 and flaky.requests == 1
    assert str(err) == "no complete response within 0.3 s"


def test_the_sim_refuses_a_missing_or_wrong_key_and_takes_the_right_one() -> None:
    with start_sim_config(api_key="sk-right") as s:

        async def go(key: str | None) -> CallRecord:
            target = Target(base_url=s.url, model=s.model, api_key=key)
            async with ChatClient(target, ClientOptions(retries=0)) as client:
                return await client.chat(MESSAGES)

        for key in (None, "sk-wrong"):
            with pytest.raises(EndpointError) as info:
                asyncio.run(go(key))
            assert info.value.kind == "http_401"
        assert asyncio.run(go("sk-right")).completion_tokens == 16


# --------------------------------------------------------------------------- stream edges


def test_a_last_event_without_its_blank_line_is_still_read_and_timed() -> None:
    record = call(sse(0.2, data({"content": "x"}, "stop").rstrip(b"\n")))
    assert record.content == "x" and record.finish_reason == "stop"
    assert record.ttft_s is not None and 0.2 <= record.ttft_s < 5.0


def test_the_call_ends_at_done_whatever_follows_it() -> None:
    """Bytes after [DONE] in the same write are ignored, and the server holding the body open
    afterwards is not part of the latency."""
    record = call(sse(data({"content": "x"}, "stop") + DONE + b"data: {not json\n\ndata: {", 1.5))
    assert record.content == "x"
    assert record.latency_s is not None and record.latency_s < 1.0


def test_data_lines_without_a_space_after_the_colon_parse() -> None:
    record = call(sse(b'data:{"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]}'
                      b"\n\ndata:[DONE]\n\n"))  # fmt: skip
    assert record.content == "a" and record.completion_tokens == 1


def test_a_closed_client_cannot_be_used_again() -> None:
    async def go() -> None:
        async with serve(sse(data({"content": "x"}, "stop"), DONE)) as url:
            client = ChatClient(Target(base_url=url, model="m"))
            async with client:
                assert (await client.chat(MESSAGES)).content == "x"
            with pytest.raises(RuntimeError, match="outside 'async with'"):
                await client.chat(MESSAGES)

    asyncio.run(go())


def test_documented_defaults() -> None:
    assert ClientOptions().model_dump() == {
        "request_timeout_s": 600.0, "retries": 2, "backoff_base_s": 0.25, "backoff_max_s": 8.0,
        "stream": True, "max_response_bytes": None,
    }  # fmt: skip
    record = CallRecord(started_at=1.0)
    assert (record.retries, record.ttft_s, record.error, record.tool_calls) == (0, None, None, [])


def test_event_and_id_lines_before_data_in_one_event_are_skipped_not_the_data() -> None:
    record = call(sse(b"event: message\nid: 1\n" + data({"content": "a"}, "stop"), DONE))
    assert record.content == "a" and record.completion_tokens == 1


def test_error_messages_keep_a_bounded_prefix_of_the_body() -> None:
    body = "x" * 400
    err = failure(json_reply(body, status=400), ClientOptions(retries=0))
    assert str(err) == "HTTP 400: " + "x" * 300
    err = failure(json_reply(body, status=503), ClientOptions(retries=0))
    assert str(err) == "HTTP 503: " + "x" * 200
    bad = b"data: {" + b"y" * 100 + b"\n\n"
    err = failure(sse(bad), ClientOptions(retries=0))
    assert str(err) == f"stream chunk is not JSON: {(b'{' + b'y' * 79)!r}"
    err = failure(sse(b"data: [" + b"1, " * 40 + b"1]\n\n"), ClientOptions(retries=0))
    assert str(err) == f"stream chunk is not an object: {(b'[' + b'1, ' * 40)[:80]!r}"


def test_an_error_without_a_call_record_used_no_retries() -> None:
    assert EndpointError("timeout", "late").retries == 0
    assert Target(base_url="http://h/v1", model="m").embedded is False


RawAnswer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def raw_failure(answer: RawAnswer, retries: int) -> EndpointError:
    """The error of one chat call against a raw loopback server that writes its own bytes."""

    async def go() -> EndpointError:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            target = Target(base_url=f"http://127.0.0.1:{port}/v1", model="m")
            async with ChatClient(target, ClientOptions(retries=retries)) as client:
                with pytest.raises(EndpointError) as info:
                    await client.chat(MESSAGES)
            return info.value
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(go())


def test_a_server_that_breaks_http_is_a_protocol_failure_and_not_retried() -> None:
    """A raw loopback server answering every request with a line that is not HTTP."""
    requests: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        writer.close()

    err = raw_failure(answer, retries=2)
    assert err.kind == "bad_status_line" and err.retries == 0 and requests == [1]
    assert str(err) == "not an HTTP status line: b'SSH-2.0-OpenSSH\\r\\n'"


def test_every_2xx_is_an_answer_and_3xx_is_not() -> None:
    body = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    for status in (200, 201, 299):
        record = call(json_reply(body, status=status), ClientOptions(stream=False))
        assert (record.status, record.content) == (status, "ok")
    err = failure(json_reply(body, status=300), ClientOptions(stream=False, retries=2))
    assert err.kind == "http_300" and err.retries == 0


def test_what_follows_done_in_later_reads_is_drained_not_parsed() -> None:
    record = call(sse(data({"content": "x"}, "stop"), DONE, 0.05, b"data: {not json\n\n"))
    assert record.content == "x" and record.finish_reason == "stop"


def test_a_slow_chunked_terminator_is_drained_so_the_connection_is_reused() -> None:
    """The server sends [DONE], then ends the body 0.2 s later: within the drain's 1 s."""

    async def go() -> tuple[int, int]:
        handler = sse(data({"content": "x"}, "stop"), DONE, 0.2)
        async with serve(handler) as url, ChatClient(Target(base_url=url, model="m")) as client:
            await client.chat(MESSAGES)
            assert client._pool is not None
            first = list(client._pool._idle)
            await client.chat(MESSAGES)
            return len(first), len(client._pool._idle)

    assert asyncio.run(go()) == (1, 1)


def test_a_json_bodys_ttft_is_counted_from_the_send() -> None:
    body = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    record = call(json_reply(body, delay_s=0.2), ClientOptions(stream=False))
    assert record.ttft_s is not None and 0.2 <= record.ttft_s < 30.0


def test_every_choice_of_an_event_is_read() -> None:
    two = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}, ' \
          b'{"index": 1, "delta": {"content": "x"}, "finish_reason": "stop"}]}\n\n'  # fmt: skip
    record = call(sse(two, DONE))
    assert (record.content, record.finish_reason, record.completion_tokens) == ("x", "stop", 1)


def test_a_status_below_200_is_not_an_answer() -> None:
    """A raw loopback server answering `199` (a 1xx as final status, as a broken proxy may)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 199 Odd\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nodd!"
        )
        await writer.drain()
        writer.close()

    err = raw_failure(answer, retries=0)
    assert err.kind == "http_199" and str(err) == "HTTP 199: odd!"


def test_chunk_times_are_recorded_only_when_asked() -> None:
    handler = sse(data({"content": "a"}), data({"content": "b"}, "stop"), DONE)
    assert call(handler).chunk_times_s is None
    times = call(handler, record_chunks=True).chunk_times_s
    assert times is not None and len(times) == 2
