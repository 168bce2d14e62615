"""`serve --trace`: a Mooncake-format trace replayed open loop at its offsets, with prompts whose
shared hash ids are shared tokens, run in-process against a real `metrale sim`."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from metrale import runner
from metrale.benchmarks.serve.client import StreamClient
from metrale.benchmarks.serve.prompts import Tokenizer
from metrale.benchmarks.serve.trace import BLOCK_TOKENS, load_trace, trace_prompts
from metrale.endpoint.client import Target
from metrale.errors import UsageError
from metrale.prefix import message_words
from tests.conftest import start_sim


def write_trace(path: Path, lines: int = 200, seed: int = 3) -> list[dict[str, Any]]:
    """`lines` requests over ~2 s: 8 conversations whose prompts grow by whole and partial
    blocks (shared leading hash ids), and one-off requests with ids of their own."""
    rng = random.Random(seed)
    rows, t, next_id = [], 0, 1000
    contexts: dict[int, list[int]] = {c: [c * 10] for c in range(8)}
    for _ in range(lines):
        t += rng.randint(0, 20)
        if rng.random() < 0.7:
            ids = contexts[rng.randrange(8)]
            if rng.random() < 0.5 and len(ids) < 4:
                ids.append(next_id)
                next_id += 1
            hash_ids = list(ids)
        else:
            hash_ids = [next_id, next_id + 1]
            next_id += 2
        full = (len(hash_ids) - 1) * BLOCK_TOKENS
        input_length = full + rng.randint(1, BLOCK_TOKENS)
        if rng.random() < 0.1:
            input_length += rng.randint(1, 100)  # longer than its blocks: padded
        rows.append({"timestamp": t, "input_length": input_length,
                     "output_length": rng.randint(2, 12), "hash_ids": hash_ids})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def run_serve(url: str, out: Path, **params: Any) -> dict[str, Any]:
    request = runner.RunRequest(
        benchmark="serve", params={"ignore_eos": False, **params},
        target=Target(base_url=url, model="metrale-sim"), out=out, preflight=False,
        progress=None,
    )  # fmt: skip
    asyncio.run(runner.run(request))
    result: dict[str, Any] = json.loads((out / "result.json").read_text())["result"]
    return result


@pytest.mark.parametrize("speed", [1.0, 4.0])
def test_requests_are_intended_at_their_offsets_open_loop(tmp_path: Path, speed: float) -> None:
    rows = write_trace(tmp_path / "trace.jsonl")
    with start_sim("--output-tokens", "64", "--prefix-cache-tokens", "10000000") as sim:
        result = run_serve(sim.url, tmp_path / "run", trace=str(tmp_path / "trace.jsonl"),
                           trace_speed=speed)  # fmt: skip
    m = result["metrics"]
    assert m["requests"] == 200 and m["errors"] == 0
    records = [json.loads(x) for x in (tmp_path / "run" / "requests.jsonl").read_text().split()]
    records.sort(key=lambda r: r["index"])
    assert len(records) == 200 and all(r["phase"] == "measure" for r in records)
    first = records[0]["intended_s"]
    for row, r in zip(rows, records, strict=True):
        # intended at the recorded offset, scaled; open loop: ready is intended (no slot wait)
        offset = (row["timestamp"] - rows[0]["timestamp"]) / 1000 / speed
        assert r["intended_s"] - first == pytest.approx(offset, abs=1e-6)
        assert r["ready_s"] == r["intended_s"] and r["send_s"] >= r["ready_s"]
        # lengths as recorded: the sim counts prompt words, and stops at max_tokens
        assert r["prompt_tokens"] == row["input_length"]
        assert r["output_tokens"] == row["output_length"]
    # the lag is reported as for every open-loop load (its size: benchmarks/trace_lag.py)
    for key in ("sched_lag_ms_p50", "sched_lag_ms_p99", "sched_lag_ms_max"):
        assert m[key] is not None and m[key] >= 0
    # the sim's cache holds everything: it serves every shared block the trace says
    assert m["prefix_hit_rate_ideal"] > 0.3
    assert m["prefix_cache_efficiency"] == pytest.approx(1.0, abs=0.01)
    levels = json.loads((tmp_path / "run" / "levels.json").read_text())
    assert levels["load"] == "trace"


def test_shared_hash_ids_are_identical_prefixes_of_their_token_length(tmp_path: Path) -> None:
    write_trace(tmp_path / "trace.jsonl")
    requests = load_trace(tmp_path / "trace.jsonl")

    async def prompts() -> list[list[str]]:
        target = Target(base_url=sim.url, model="metrale-sim")
        async with StreamClient(target) as client:
            tokenizer = Tokenizer(client.pool, target)
            assert await tokenizer.detect()
            made = await trace_prompts(requests, tokenizer)
        return [message_words(p.messages) for p in made]

    with start_sim() as sim:
        words = asyncio.run(prompts())
    shared_pairs = 0
    for a in range(len(requests)):
        assert len(words[a]) == requests[a].input_length  # the sim's tokenizer: words
        for b in range(a + 1, len(requests)):
            ids_a, ids_b = requests[a].hash_ids, requests[b].hash_ids
            k = 0
            while k < min(len(ids_a), len(ids_b)) and ids_a[k] == ids_b[k]:
                k += 1
            common = min(k * BLOCK_TOKENS, len(words[a]), len(words[b]))
            assert words[a][:common] == words[b][:common]
            if k < min(len(ids_a), len(ids_b)):  # the first differing block differs at once
                start = k * BLOCK_TOKENS
                if start < min(len(words[a]), len(words[b])):
                    assert words[a][start] != words[b][start]
            shared_pairs += k > 0
    assert shared_pairs > 1000


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("not json", "line 1 is not JSON"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "line 1"),
        ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": []}', "line 1"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}', "line 1"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "hash_ids"),
        ("", "has no requests"),
    ],
)
def test_a_bad_trace_is_one_usage_error_before_any_work(
    tmp_path: Path, line: str, needle: str
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(UsageError, match=needle):
        runner.prepare(runner.RunRequest(benchmark="serve", params={"trace": str(path)},
                                         target=None))  # fmt: skip


def test_a_trace_takes_no_other_load_or_prompts(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, lines=3)
    for extra in ({"load": "sweep"}, {"prompts": "gsm8k"}, {"shared_prefix_tokens": 8}):
        with pytest.raises(UsageError, match="--trace"):
            params = {"trace": str(path), **extra}
            runner.prepare(runner.RunRequest(benchmark="serve", params=params, target=None))


def test_timestamps_are_offsets_from_the_first_sorted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 5000, "input_length": 3, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 4000, "input_length": 4, "output_length": 2, "hash_ids": [2]}\n'
        '{"timestamp": 4000.5, "input_length": 5, "output_length": 3, "hash_ids": []}\n'
    )
    trace = load_trace(path)
    assert [r.offset_s for r in trace] == [0.0, pytest.approx(0.0005), 1.0]
    assert [r.input_length for r in trace] == [4, 5, 3]
