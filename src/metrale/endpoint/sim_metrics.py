"""The simulator's Prometheus `/metrics` page, from the serving model's counters.

Two sets of names, so that metrale's telemetry can be tested against each family it reads:

- `vllm` (the default): vLLM's names, gauges `vllm:num_requests_running`,
  `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (and its older name
  `vllm:gpu_cache_usage_perc`), counters `vllm:prefix_cache_queries_total`,
  `vllm:prefix_cache_hits_total` (tokens), `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`, `vllm:request_success_total`;
- `llama-server`: llama.cpp's server with `--metrics`: `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`, `llamacpp:kv_cache_usage_ratio`,
  `llamacpp:prompt_tokens_total` (the prompt tokens it *processed*, cached ones excluded, as
  llama-server counts them) and `llamacpp:tokens_predicted_total`; it has no prefix-cache
  counters.
"""

from __future__ import annotations

from metrale.endpoint.sim_model import ServingModel


def render(model: ServingModel, names: str, model_name: str) -> str:
    """The text exposition format (version 0.0.4) of the model's counters under `names`."""
    c = model.counters
    label = '{model_name="' + model_name.replace('"', "") + '"}'
    rows: list[tuple[str, str, float]]
    if names == "llama-server":
        label = ""
        rows = [
            ("llamacpp:requests_processing", "gauge", c.running),
            ("llamacpp:requests_deferred", "gauge", c.waiting),
            ("llamacpp:kv_cache_usage_ratio", "gauge", model.kv_usage),
            ("llamacpp:prompt_tokens_total", "counter", c.prompt_tokens - c.prefix_hits),
            ("llamacpp:tokens_predicted_total", "counter", c.generation_tokens),
        ]
    else:
        rows = [
            ("vllm:num_requests_running", "gauge", c.running),
            ("vllm:num_requests_waiting", "gauge", c.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", model.kv_usage),
            ("vllm:gpu_cache_usage_perc", "gauge", model.kv_usage),
            ("vllm:prefix_cache_queries_total", "counter", c.prefix_queries),
            ("vllm:prefix_cache_hits_total", "counter", c.prefix_hits),
            ("vllm:prompt_tokens_total", "counter", c.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", c.generation_tokens),
            ("vllm:request_success_total", "counter", c.requests_done),
        ]
    out: list[str] = []
    for name, kind, value in rows:
        out.append(f"# TYPE {name} {kind}")
        out.append(f"{name}{label} {float(value)!r}")
    return "\n".join(out) + "\n"
