"""GSM8K: grade-school math, exact-match on the final number (data: `metrale.datasets`)."""

from metrale.benchmarks.gsm8k.answer import extract_answer, normalize_number
from metrale.benchmarks.gsm8k.benchmark import Gsm8kBenchmark, load_problems

__all__ = ["Gsm8kBenchmark", "extract_answer", "load_problems", "normalize_number"]
