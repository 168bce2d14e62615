"""Agreement with guidellm on the embedded llama.cpp server: same prompts, same load, same bodies.

Both tools use `/v1/completions`: guidellm's chat requests send content as a list of parts,
which llama-cpp-python 0.3's chat handler answers with an empty 200 stream (every request an
error in guidellm), so the chat endpoint cannot be compared.

One `LocalLlamaServer` (llama-cpp-python, SmolLM2-135M-Instruct, the default target) serves both
tools in turn, each given the same JSONL prompts (GSM8K questions), the same concurrency and
request count, `max_tokens` and `temperature = 0` in the request body (llama-cpp-python ignores
`max_completion_tokens`, which guidellm sends, so both set `max_tokens` explicitly, and greedy
decoding makes both tools get the same completions). Each pair of runs is repeated and the
medians compared: TTFT p50, TPOT p50 and output throughput, with the relative difference.

Usage: python benchmarks/serve_agreement.py [--requests 24] [--concurrency 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MAX_TOKENS = 32


def metrale_run(url: str, prompts: Path, args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "metrale", "run", "serve", "--target", url, "--no-preflight",
        "--prompts", str(prompts), "--concurrency", str(args.concurrency),
        "--requests", str(args.requests), "--max-tokens", str(MAX_TOKENS),
        "--temperature", "0", "--api", "completions", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if not (out / "result.json").is_file():
        raise RuntimeError(proc.stderr[-400:])
    m = json.loads((out / "result.json").read_text())["result"]["metrics"]
    return {
        "ttft_ms_p50": m["ttft_ms_p50"],
        "tpot_ms_p50": m["tpot_ms_p50"],
        "itl_ms_p50": m["itl_ms_p50"],
        "e2e_ms_p50": m["e2e_ms_p50"],
        "output_tps": m["output_throughput"],
        "output_tokens_mean": m["output_tokens_mean"],
    }


def guidellm_run(exe: str, url: str, prompts: Path, args: argparse.Namespace, out: Path) -> dict:
    backend = {
        "kind": "openai_http", "target": url.removesuffix("/v1"), "model": args.model,
        "request_format": "/v1/completions",
        # metrale sends ignore_eos (where a server honours it): the same body for both.
        "extras": {"body": {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}},
        # llama-cpp-python has no /health, which guidellm's validation GETs.
        "validate_backend": False,
    }  # fmt: skip
    cmd = [
        exe, "run", "--backend", json.dumps(backend),
        "--profile", f"kind=concurrent,streams={args.concurrency}",
        "--constraint", f"kind=max_requests,count={args.requests}",
        "--data", f"kind=json_file,path={prompts}",
        "--output", f"kind=json,path={out}", "--disable-console",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError((proc.stderr or proc.stdout)[-600:])
    bench = json.loads(out.read_text())["benchmarks"][0]
    ok = bench["requests"]["successful"]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in ok if r.get(key) is not None)

    timings = [r["info"]["timings"] for r in ok]
    window = max(t["request_end"] for t in timings) - min(t["request_start"] for t in timings)
    return {
        "ttft_ms_p50": med("time_to_first_token_ms"),
        # guidellm's ITL is (last token − first token) / (tokens − 1): metrale's TPOT formula.
        "tpot_ms_p50": med("inter_token_latency_ms"),
        "e2e_ms_p50": med("request_latency") * 1000,
        # Over the same window as metrale's: first send to last end.
        "output_tps": sum(r["output_tokens"] or 0 for r in ok) / window,
        "output_tokens_mean": statistics.fmean(r["output_tokens"] or 0 for r in ok),
        # guidellm's own figures, with its own definitions, for reference.
        "guidellm_tpot_ms_p50": med("time_per_output_token_ms"),
        "guidellm_output_tps": bench["metrics"]["output_tokens_per_second"]["successful"]["mean"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--guidellm", default=shutil.which("guidellm") or "/tmp/gllm-venv/bin/guidellm")
    args = ap.parse_args()
    from metrale.benchmarks.serve.prompts import gsm8k_questions
    from metrale.endpoint.local import MODEL_NAME, LocalLlamaServer

    args.model = MODEL_NAME
    work = Path(tempfile.mkdtemp(prefix="serve-agreement-"))
    prompts = work / "prompts.jsonl"
    with prompts.open("w") as f:
        for p in gsm8k_questions()[: args.requests]:
            # "Answer:" invites a continuation: a bare question sometimes gets EOS as its first
            # token (llama-cpp-python does not honour ignore_eos), which guidellm counts as an
            # error and metrale as a `no_output` error, and the two would measure different sets.
            text = f"Question: {p.messages[0]['content']}\nAnswer:"
            f.write(json.dumps({"prompt": text}) + "\n")
    runs: dict[str, list[dict]] = {"metrale": [], "guidellm": []}

    async def serve_both() -> None:
        async with LocalLlamaServer(n_ctx=2048) as url:
            for i in range(args.repeats):
                runs["metrale"].append(
                    await asyncio.to_thread(metrale_run, url, prompts, args, work / f"m{i}")
                )
                runs["guidellm"].append(
                    await asyncio.to_thread(
                        guidellm_run, args.guidellm, url, prompts, args, work / f"g{i}.json"
                    )
                )
                print(f"run {i}: metrale {runs['metrale'][-1]}\n       guidellm "
                      f"{runs['guidellm'][-1]}", file=sys.stderr, flush=True)  # fmt: skip

    asyncio.run(serve_both())
    keys = ["ttft_ms_p50", "tpot_ms_p50", "e2e_ms_p50", "output_tps", "output_tokens_mean"]
    print(
        f"llama.cpp (llama-cpp-python) SmolLM2-135M, concurrency {args.concurrency}, "
        f"{args.requests} GSM8K prompts, max_tokens {MAX_TOKENS}, median of {args.repeats}"
    )
    print("| metric | metrale | guidellm | difference |")
    print("|---|---|---|---|")
    for key in keys:
        a = statistics.median(r[key] for r in runs["metrale"])
        b = statistics.median(r[key] for r in runs["guidellm"])
        print(f"| {key} | {a:.2f} | {b:.2f} | {(a - b) / b * 100:+.1f}% |")
    for key in ("guidellm_tpot_ms_p50", "guidellm_output_tps"):
        print(f"| {key} (guidellm's definition) | | "
              f"{statistics.median(r[key] for r in runs['guidellm']):.2f} | |")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
