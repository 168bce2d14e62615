"""The one SSE parser and its definitions, on hand-made bytes delivered in hand-made reads.

`_read_sse` is fed by a stand-in for `http.Response` (status and `consume`), so that each
read's bytes and its arrival order are the test's; the real transport is tested in test_http.py
and, end to end, in test_client_timing.py and tests/benchmarks/serve/test_client.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

from metrale.endpoint.stream import (
    CallFailed,
    Completion,
    StreamParser,
    _read_sse,
    chunk_gaps,
    spread_tokens,
)


class _Resp:
    """Delivers `pieces` one per 10 ms, each stamped on arrival, so that each gets a later
    stamp than the last."""

    status = 200

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = iter(pieces)
        self.sent_at = time.perf_counter()

    async def consume(
        self, on_piece: Callable[[bytes, float], bool], max_bytes: int | None = None
    ) -> None:
        for piece in self.pieces:
            await asyncio.sleep(0.01)
            if on_piece(piece, time.perf_counter()):
                return


def read(pieces: list[bytes], keep_text: bool = False) -> Completion:
    parser = StreamParser(keep_text=keep_text, keep_times=True)
    return asyncio.run(_read_sse(_Resp(pieces), parser, None))  # type: ignore[arg-type]


def event(
    delta: dict[str, object], usage: dict[str, int] | None = None, finish: str | None = None
) -> bytes:
    chunk: dict[str, object] = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def test_a_reasoning_prefix_multi_token_chunks_and_events_split_across_reads() -> None:
    pieces = [
        event({"role": "assistant"}),
        event({"reasoning_content": "hmm"}, {"completion_tokens": 1}),
        event({"content": "Hel"}, {"completion_tokens": 2}),
        # Two events in one read, the second split across reads.
        event({"content": "lo wor"}, {"completion_tokens": 5}) + event({"content": "ld"})[:20],
        event({"content": "ld"})[20:][:-2] + b"\n\n" + event({}, finish="stop")
        + b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":6}}\n\n' + DONE,
    ]  # fmt: skip
    done = read(pieces, keep_text=True)
    assert done.reasoning_chunks == 1 and done.chunks == 4
    times = done.chunk_times_s
    assert times is not None and len(times) == 4 and times == sorted(times)
    # TTFT counts reasoning; TTFC waits for content; both are chunk stamps, not new clocks.
    assert done.ttft_s == times[0] < done.ttfc_s == times[1]
    assert times[2] < times[3]  # the 4th event is completed only by the 5th read
    assert done.e2e_s is not None and done.e2e_s >= times[3]
    assert (done.completion_tokens, done.prompt_tokens, done.token_source) == (6, 3, "usage")
    assert (done.content, done.reasoning, done.finish_reason) == ("Hello world", "hmm", "stop")
    # Per-chunk usage covers 3 of 4 chunks: not all, so the even spread applies.
    assert done.chunk_tokens() == [1.5] * 4


def test_without_usage_the_chunks_are_counted() -> None:
    done = read([event({"content": "a"}), event({"content": "b"}, finish="stop"), DONE])
    assert (done.completion_tokens, done.token_source) == (2, "counted")
    assert done.chunk_tokens() == [1.0, 1.0]
    assert done.content == ""  # keep_text=False: serve keeps no text


def test_a_stream_cut_before_its_end_is_a_retryable_connection_failure() -> None:
    with pytest.raises(CallFailed) as info:
        read([event({"content": "a"})])
    assert info.value.kind == "connection" and info.value.retryable


def test_done_without_a_finish_reason_is_an_incomplete_stream() -> None:
    with pytest.raises(CallFailed) as info:
        read([event({"content": "a"}), DONE])
    assert info.value.kind == "incomplete_stream" and not info.value.retryable


def test_completions_text_chunks_are_content() -> None:
    text = b'data: {"choices": [{"index": 0, "text": "hi", "finish_reason": null}]}\n\n'
    end = b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}\n\n'
    done = read([text, text, end, DONE], keep_text=True)
    assert done.completion_tokens == 2 and done.ttfc_s == done.ttft_s
    assert done.content == "hihi" and done.finish_reason == "length"


def test_e2e_is_the_read_that_carried_done() -> None:
    done = read([event({"content": "a"}, finish="stop"), b": keep-alive\n\n", DONE])
    assert done.ttft_s is not None and done.e2e_s is not None
    assert done.e2e_s > done.ttft_s  # [DONE] came two reads (>= 20 ms) after the chunk


def test_a_json_body_is_one_chunk_whose_ttft_is_its_e2e() -> None:
    parser = StreamParser(keep_text=False, keep_times=True)
    body = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 9}}  # fmt: skip
    done = parser.body(body, 200, 0.25)
    assert (done.ttft_s, done.ttfc_s, done.e2e_s, done.chunk_times_s) == (0.25, 0.25, 0.25, [0.25])
    assert (done.completion_tokens, done.token_source, done.chunk_tokens()) == (9, "usage", [9.0])
    bare = StreamParser().body({"choices": [{"message": {"content": "x"}}]}, 200, 0.1)
    assert (bare.completion_tokens, bare.token_source) == (None, None)
    with pytest.raises(CallFailed) as info:
        StreamParser().body({"choices": "x"}, 200, 0.1)
    assert info.value.kind == "malformed_response"


def test_spread_tokens_prefers_per_chunk_usage_then_an_even_spread() -> None:
    assert spread_tokens(3, 4, [1, 3, 4]) == [1, 2, 1]
    assert spread_tokens(4, 8, []) == [2, 2, 2, 2]
    assert spread_tokens(2, None, []) == [1, 1]
    assert spread_tokens(0, 5, []) == []
    # per-chunk usage on reasoning chunks only: no content chunk to spread tokens over
    assert spread_tokens(0, 5, [5]) == []


def test_chunk_gaps_are_consecutive_differences() -> None:
    assert chunk_gaps([0.1, 0.15, 0.3]) == pytest.approx([0.05, 0.15])
    assert chunk_gaps([0.1]) == [] and chunk_gaps([]) == []


def feed_all(parser: StreamParser, *events: bytes, now: float = 0.5) -> list[bool]:
    return [parser.feed(e.rstrip(b"\n"), now) for e in events]


def test_tool_call_deltas_merge_by_index_and_keep_their_id() -> None:
    parser = StreamParser()
    feed_all(
        parser,
        event({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "l"}}]}),
        event({"tool_calls": [{"index": 1, "id": "", "function": {"name": "s"}}]}),
        event({"tool_calls": [{"index": 0, "id": "a", "function": {"arguments": "{"}}]}),
        # no index: the next free one; no function: nothing to add
        event({"tool_calls": [{"id": "c"}]}),
        event({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, finish="tool_calls"),
    )
    done = parser.finish(200)
    assert [(t.id, t.name, t.arguments) for t in done.tool_calls] == [
        ("a", "", "{}"), ("b", "ls", ""), ("c", "", "")
    ]  # fmt: skip
    assert (done.chunks, done.reasoning_chunks, done.content) == (5, 5, "")


def test_without_keep_text_nothing_is_kept_but_everything_is_counted() -> None:
    parser = StreamParser(keep_text=False)
    feed_all(parser, event({"reasoning": "r"}), event({"tool_calls": [{"index": 0, "id": "x"}]}),
             event({"content": "c"}, finish="stop"))  # fmt: skip
    done = parser.finish(200)
    assert (done.content, done.reasoning, done.tool_calls) == ("", "", [])
    assert (done.chunks, done.reasoning_chunks, done.completion_tokens) == (3, 2, 3)
    assert done.chunk_times_s is None  # keep_times=False


def test_feed_says_done_at_done_and_stamps_each_event_with_its_read() -> None:
    parser = StreamParser(keep_times=True)
    assert parser.feed(b": comment", 0.1) is False and parser.last_event is None
    assert parser.feed(b"event: x\nid: 2", 0.15) is False and parser.last_event is None
    assert parser.feed(event({"content": "a"}).rstrip(b"\n"), 0.2) is False
    assert parser.feed(event({}, finish="length").rstrip(b"\n"), 0.3) is False
    assert parser.feed(DONE.rstrip(b"\n"), 0.4) is True and parser.done
    done = parser.finish(200)
    assert (done.ttft_s, done.ttfc_s, done.e2e_s, done.chunk_times_s) == (0.2, 0.2, 0.4, [0.2])
    assert (done.finish_reason, done.status) == ("length", 200)


def test_per_chunk_usage_is_kept_only_from_output_chunks_that_carry_it() -> None:
    parser = StreamParser()
    feed_all(
        parser,
        event({"content": "a"}, {"completion_tokens": 2}),
        event({"content": "b"}),
        event({"content": "c"}, {"prompt_tokens": 4}),  # usage without completion_tokens
        event({"content": "d"}, {"completion_tokens": 7}, finish="stop"),
    )
    assert parser.usages == [2, 7]
    done = parser.finish(200)
    assert (done.completion_tokens, done.token_source, done.prompt_tokens) == (7, "usage", None)
    assert done.chunk_usage == [2, 7] and done.chunk_tokens() == [1.75] * 4


def test_a_finish_reason_on_a_content_chunk_counts_and_the_last_one_wins() -> None:
    parser = StreamParser()
    feed_all(parser, event({"content": "a"}, finish="length"), event({}, finish="stop"))
    assert parser.finish(200).finish_reason == "stop"
    only = StreamParser()
    feed_all(only, event({"content": "a"}, finish="stop"))
    assert only.finish(200).finish_reason == "stop"


def test_spread_tokens_never_gives_a_chunk_negative_tokens() -> None:
    assert spread_tokens(3, 5, [2, 1, 5]) == [2.0, 0.0, 4.0]  # a server's count went back
    assert spread_tokens(2, 0, []) == [1.0, 1.0]  # zero reported tokens: one a chunk
    assert spread_tokens(2, 3, [3]) == [1.5, 1.5]  # usage on some chunks only


def test_a_json_body_with_no_choices_or_no_keep_text() -> None:
    empty = StreamParser().body({"choices": []}, 200, 0.3)
    assert (empty.finish_reason, empty.content, empty.chunks, empty.chunk_times_s) == (
        None, "", 1, None
    )  # fmt: skip
    body = {"choices": [{"text": "t", "finish_reason": "length",
                         "message": {"reasoning": "r", "tool_calls": [{"id": "i"}, {}]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 0}}  # fmt: skip
    done = StreamParser().body(body, 201, 0.3)
    assert (done.content, done.reasoning, done.finish_reason, done.status) == (
        "t", "r", "length", 201
    )  # fmt: skip
    assert [(t.id, t.name, t.arguments) for t in done.tool_calls] == [("i", "", ""), ("", "", "")]
    assert (done.prompt_tokens, done.completion_tokens, done.token_source) == (5, 0, "usage")
    silent = StreamParser(keep_text=False).body(body, 200, 0.3)
    assert (silent.content, silent.reasoning, silent.tool_calls) == ("", "", [])
    assert silent.finish_reason == "length"


def test_retry_after_is_seconds_or_nothing() -> None:
    from metrale.endpoint.stream import _retry_after

    assert _retry_after("2.5") == 2.5 and _retry_after("0") == 0.0
    assert _retry_after(None) is None and _retry_after("Wed, 21 Oct 2026 07:28:00 GMT") is None


def test_an_error_event_is_a_stream_error_with_a_bounded_message() -> None:
    parser = StreamParser()
    with pytest.raises(CallFailed) as info:
        parser.feed(b'data: {"error": "' + b"e" * 300 + b'"}', 0.1)
    assert info.value.kind == "stream_error" and not info.value.retryable
    assert str(info.value) == "server error in stream: " + "e" * 200


def test_bytes_after_done_in_the_same_read_are_not_parsed() -> None:
    done = read([event({"content": "a"}, finish="stop") + DONE + b"data: {broken\n\n"])
    assert done.content == "" and done.chunks == 1 and done.finish_reason == "stop"
    # ... and a trailing event without its blank line is parsed at the end of the body
    tail = read([event({"content": "a"}), event({}, finish="stop").rstrip(b"\n")])
    assert tail.finish_reason == "stop" and tail.chunks == 1


def test_a_json_body_reads_its_first_choice_and_has_no_reasoning_chunks() -> None:
    body = {"choices": [{"message": {"content": "first"}, "finish_reason": "stop"},
                        {"message": {"content": "second"}, "finish_reason": "length"}]}  # fmt: skip
    done = StreamParser().body(body, 200, 0.2)
    assert (done.content, done.finish_reason, done.chunks, done.reasoning_chunks) == (
        "first", "stop", 1, 0
    )  # fmt: skip


def test_an_empty_completion_has_no_chunks_and_no_times() -> None:
    empty = Completion(status=200)
    assert (empty.chunks, empty.reasoning_chunks, empty.ttft_s, empty.e2e_s) == (0, 0, None, None)
    assert empty.chunk_tokens() == [] and empty.tool_calls == [] and empty.chunk_usage == []


def test_a_crlf_stream_is_split_into_events_as_each_read_arrives() -> None:
    crlf = [p.replace(b"\n", b"\r\n") for p in
            (event({"content": "a"}), event({"content": "b"}, finish="stop"), DONE)]  # fmt: skip
    done = read(crlf, keep_text=True)
    assert done.content == "ab" and done.finish_reason == "stop"
    times = done.chunk_times_s
    assert times is not None and len(times) == 2 and times[0] < times[1]  # reads 10 ms apart
