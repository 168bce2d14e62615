"""GSM8K: grade-school math, exact-match on the final number.

Data: the GSM8K test split (Cobbe et al., 2021, "Training Verifiers to Solve Math Word
Problems"), MIT licence, copyright 2021 OpenAI; shipped in `data/` with its LICENSE.
"""

from metrale.benchmarks.gsm8k.answer import extract_answer, normalize_number
from metrale.benchmarks.gsm8k.benchmark import Gsm8kBenchmark, load_problems

__all__ = ["Gsm8kBenchmark", "extract_answer", "load_problems", "normalize_number"]
