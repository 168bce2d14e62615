"""terminal_bench: tasks in the Harbor layout in containers (see `benchmark`)."""

from metrale.benchmarks.terminal_bench.benchmark import TerminalBenchBenchmark

__all__ = ["TerminalBenchBenchmark"]
