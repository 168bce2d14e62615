"""Server telemetry's reading side: each engine's names into one vocabulary, what is not
Prometheus text, and the summary of a window of samples."""

from __future__ import annotations

import pytest

from metrale.endpoint.scrape import NAMES, Sample, parse_page, summarize

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:generation_tokens_total{engine="0",model_name="m"} 4.2e+03
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
"""
SGLANG = """\
sglang:num_running_reqs{model_name="m"} 5
sglang:num_queue_reqs{model_name="m"} 7
sglang:token_usage{model_name="m"} 0.3
sglang:cache_hit_rate{model_name="m"} 0.75
sglang:prompt_tokens_total{model_name="m"} 10
sglang:generation_tokens_total{model_name="m"} 20
"""
TGI = """\
tgi_batch_current_size 4
tgi_queue_size 1
tgi_request_input_length_sum 300
tgi_request_input_length_count 3
tgi_request_generated_tokens_sum 90
"""
LLAMA = """\
llamacpp:requests_processing 2
llamacpp:requests_deferred 0
llamacpp:kv_cache_usage_ratio 0.125
llamacpp:prompt_tokens_total 64
llamacpp:tokens_predicted_total 32
"""


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        (VLLM, {"running": 4, "waiting": 2, "kv_cache_usage": 0.375, "prefix_queries": 1000,
                "prefix_hits": 250, "prompt_tokens": 1000, "generation_tokens": 4200}),
        (SGLANG, {"running": 5, "waiting": 7, "kv_cache_usage": 0.3, "prefix_hit_rate": 0.75,
                  "prompt_tokens": 10, "generation_tokens": 20}),
        (TGI, {"running": 4, "waiting": 1, "prompt_tokens": 300, "generation_tokens": 90}),
        (LLAMA, {"running": 2, "waiting": 0, "kv_cache_usage": 0.125, "prompt_tokens": 64,
                 "generation_tokens": 32}),
    ],
    ids=["vllm", "sglang", "tgi", "llama-server"],
)  # fmt: skip
def test_each_engine_reads_into_one_vocabulary(page: str, expected: dict[str, float]) -> None:
    values, garbage = parse_page(page)
    assert garbage == 0
    assert values == pytest.approx(expected)


def test_garbage_lines_are_counted_and_unknown_names_ignored() -> None:
    page = "<html>404</html>\nvllm:num_requests_running 2\nnot a metric line at all\n" \
        "something_else_total 5\nvllm:num_requests_waiting abc\n"  # fmt: skip
    values, garbage = parse_page(page)
    assert values == {"running": 2}
    assert garbage == 3
    assert parse_page('foo 1\nbar{a="b"} 2\n') == ({}, 0)


def test_every_mapped_name_reaches_a_known_key() -> None:
    assert set(NAMES.values()) == {
        "running", "waiting", "kv_cache_usage", "prefix_hit_rate", "prefix_queries",
        "prefix_hits", "prompt_tokens", "generation_tokens",
    }  # fmt: skip


def test_a_window_summary_reads_gauges_inside_and_counters_across_it() -> None:
    def s(t: float, running: float, queries: float, hits: float, gen: float) -> Sample:
        values = {"running": running, "prefix_queries": queries, "prefix_hits": hits,
                  "generation_tokens": gen}  # fmt: skip
        return Sample(t, 0.0, values)

    samples = [s(0.0, 0, 0, 0, 0), s(1.0, 2, 100, 10, 50), s(2.0, 4, 200, 60, 150),
               s(3.0, 0, 300, 110, 200)]  # fmt: skip
    got = summarize(samples, 0.5, 2.5)
    assert got["server_requests_running_mean"] == 3 and got["server_requests_running_max"] == 4
    # counters from the last sample before the window (t=0) to the first after it (t=3)
    assert got["server_prefix_hit_rate"] == pytest.approx(110 / 300)
    assert got["server_generation_tokens_per_s"] == pytest.approx(200 / 3)
    assert got["server_telemetry_samples"] == 2
    assert summarize(samples, 5.0, 6.0) == {}
    # a counter that went down (a restarted server) gives no rate
    assert "server_generation_tokens_per_s" not in summarize(
        [s(0, 0, 0, 0, 100), s(1, 0, 0, 0, 5)], 0, 1
    )
