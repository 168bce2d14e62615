"""Serve: how an endpoint serves under load (TTFT, TPOT, ITL, E2E, throughput, goodput).

`metrics` defines every number, `load` generates the load (concurrency, rates, the sweep),
`client` is the lean streaming HTTP path, `prompts` builds the prompts, `benchmark` wires them
into the plugin contract, and `plot` draws a sweep's latency–throughput curve.
"""

from metrale.benchmarks.serve.benchmark import ServeBenchmark

__all__ = ["ServeBenchmark"]
