"""The serve benchmark end to end through the CLI against `metrale sim`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli


def serve(url: str, out: Path, *flags: str) -> dict:  # type: ignore[type-arg]
    proc = run_cli(["run", "serve", "--target", url, "--no-preflight", "--out", str(out), *flags])
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "result.json").read_text())["result"]


def requests(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def test_usage_present_exact_prompts_and_request_records(sim_factory, tmp_path: Path) -> None:
    s = sim_factory("--output-tokens", "8", "--itl", "0.002")
    result = serve(s.url, tmp_path, "--concurrency", "4", "--requests", "20", "--warmup", "4",
                   "--input-tokens", "37", "--max-tokens", "8")  # fmt: skip
    m = result["metrics"]
    assert m["requests"] == 20 and m["errors"] == 0
    assert m["tokens_counted"] == 0 and m["input_tokens_exact"] == 1
    assert m["prompt_tokens_mean"] == 37  # the sim tokenizes by words, the same as its usage
    assert m["output_tokens_mean"] == 8
    # The sim's 2 ms ITL; a loaded machine stretches it, never by 25x (seconds would read 0.002).
    assert 1.0 <= m["tpot_ms_p50"] < 50
    rows = requests(tmp_path)
    assert sum(r["phase"] == "warmup" for r in rows) == 4
    measured = [r for r in rows if r["phase"] == "measure"]
    assert len(measured) == 20
    for r in measured:
        assert r["send_s"] >= r["ready_s"] >= r["intended_s"]
        assert len(r["chunk_times_s"]) == 8 and r["chunk_tokens"] == [1.0] * 8
        assert r["token_source"] == "usage" and r["error"] is None
    assert (tmp_path / "levels.json").is_file()


def test_usage_absent_counts_chunks_and_says_so(sim_factory, tmp_path: Path) -> None:
    s = sim_factory("--output-tokens", "5", "--no-usage")
    result = serve(s.url, tmp_path, "--concurrency", "2", "--requests", "10")
    assert result["metrics"]["tokens_counted"] == 1
    assert result["metrics"]["output_tokens_mean"] == 5
    assert any("counted" in log["message"] for log in result["logs"])
    assert all(r["token_source"] == "counted" for r in requests(tmp_path))


def test_goodput_with_slos(sim_factory, tmp_path: Path) -> None:
    s = sim_factory("--ttft", "0.05", "--output-tokens", "4")
    strict = serve(s.url, tmp_path / "a", "--load", "rate", "--rate", "40", "--requests", "20",
                   "--slo", "ttft_ms=30")  # fmt: skip
    assert strict["metrics"]["goodput"] == 0.0
    loose = serve(s.url, tmp_path / "b", "--load", "rate", "--rate", "40", "--requests", "20",
                  "--slo", "ttft_ms=500", "--slo", "e2e_ms=1000")  # fmt: skip
    m = loose["metrics"]
    assert m["goodput"] == pytest.approx(m["request_throughput"])
    assert m["goodput_fraction"] == 1.0
    # The sim cannot answer before its 50 ms; load only adds (and stays within the 500 ms SLO).
    assert 50.0 <= m["ttft_ms_p50"] < 500


@pytest.mark.slow
def test_sweep_finds_the_knee_of_a_known_capacity(sim_factory, tmp_path: Path) -> None:
    # 4 slots, each request 10 ms + 9 x 10 ms = 0.1 s: capacity 40 req/s, 10 req/s at c=1.
    s = sim_factory("--max-running", "4", "--ttft", "0.01", "--itl", "0.01",
                    "--output-tokens", "10")  # fmt: skip
    result = serve(s.url, tmp_path, "--load", "sweep", "--requests", "none", "--duration-s",
                   "2.5", "--sweep-levels", "3", "--sweep-concurrency", "16",
                   "--slo", "e2e_ms=250", "--max-tokens", "10")  # fmt: skip
    m = result["metrics"]
    # Capacity bounds throughput from above exactly; a loaded machine only lowers it.
    assert 5 < m["l0.request_throughput"] <= 10.5
    # asyncio sleeps overshoot by up to 1 ms each: ~0.11 s a request, ~36 req/s.
    assert 20 < m["saturation_throughput"] <= 42
    assert m["l1.goodput"] < 5  # 16 queued on 4 slots: e2e ~0.4 s misses the SLO
    # Rates between ~10 and ~36/s fit the capacity: the knee is the highest of them, or the
    # next one down when a loaded machine slows the simulator's clock (never saturation).
    levels = json.loads((tmp_path / "levels.json").read_text())
    goodputs = [lv["metrics"]["goodput"] for lv in levels["levels"]]
    assert levels["knee"] in (3, 4), goodputs
    assert levels["levels"][levels["knee"]]["rate"] < 40
    assert goodputs[levels["knee"]] > 20
    assert len(result["table"]["rows"]) == 5
    plot = run_cli(["plot", str(tmp_path), "-o", str(tmp_path / "curve.png")], timeout=120)
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--load", "rate"], "needs --rate"),
        (["--slo", "latency=3"], "accepted keys"),
        (["--prompts", "/nonexistent.jsonl"], "prompts file"),
        (["--requests", "none"], "must stop"),
        (["--percentiles", "50,120"], "0..100"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(flags: list[str], needle: str) -> None:
    proc = run_cli(["run", "serve", "--target", "http://127.0.0.1:9/v1", *flags], timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr


def test_jsonl_prompts_file(sim_factory, tmp_path: Path) -> None:
    s = sim_factory("--output-tokens", "4")
    file = tmp_path / "p.jsonl"
    file.write_text('{"prompt": "one two three"}\n{"messages": [{"role": "user", '
                    '"content": "four five"}], "max_tokens": 2}\n')  # fmt: skip
    result = serve(s.url, tmp_path / "run", "--prompts", str(file), "--concurrency", "1",
                   "--requests", "4")  # fmt: skip
    assert result["metrics"]["output_tokens_mean"] == 3  # 4 and 2 tokens in turn
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 1}\n')
    proc = run_cli(["run", "serve", "--target", s.url, "--prompts", str(bad)])
    assert proc.returncode == 2 and "line 1" in proc.stderr


def test_api_flag_reaches_the_benchmark_not_api_key(sim_factory, tmp_path: Path) -> None:
    # argparse would take --api for an abbreviation of --api-key; the run parser allows none.
    s = sim_factory()
    flags = ["--api", "completions", "--requests", "2", "--max-error-rate", "none"]
    proc = run_cli(
        ["run", "serve", "--target", s.url, "--no-preflight", "--out", str(tmp_path), *flags]
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "run.json").read_text())["params"]["api"] == "completions"
    rows = requests(tmp_path)
    assert all(r["error"].startswith("http_404") for r in rows)  # the sim serves chat only
