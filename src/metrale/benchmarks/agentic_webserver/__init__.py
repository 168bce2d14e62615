"""agentic_webserver: can this deployment of a model do a small real engineering task (build,
test, run and tear down a Rust Axum ping/pong server in a sandbox), how fast per turn, and does
it follow directions? The prompt is `prompt.txt`, verbatim from issue #4."""

from metrale.benchmarks.agentic_webserver.benchmark import AgenticWebserverBenchmark, task_prompt
from metrale.benchmarks.agentic_webserver.directions import CHECKS, check_directions

__all__ = ["CHECKS", "AgenticWebserverBenchmark", "check_directions", "task_prompt"]
