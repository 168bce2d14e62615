"""`metrale sim`'s flags for what tests of a client need to tell apart: headers held back from
the first token (`--header-delay`), and a required bearer token (`--require-api-key`)."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import run_cli, start_sim

BODY = json.dumps({"model": "metrale-sim", "messages": [{"role": "user", "content": "hi"}]})


def _post(url: str, key: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"{url}/chat/completions", data=BODY.encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_require_api_key_refuses_a_missing_or_wrong_key() -> None:
    with start_sim("--require-api-key", "s3cret") as sim:
        assert _post(sim.url) == 401
        assert _post(sim.url, "wrong") == 401
        assert _post(sim.url, "s3cret") == 200


def test_header_delay_holds_the_status_line_back() -> None:
    with start_sim("--header-delay", "0.5", "--ttft", "3.0") as sim:
        host, port = sim.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            payload = json.dumps({**json.loads(BODY), "stream": True}).encode()
            conn.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            sent = time.perf_counter()
            first = conn.recv(1)
            headers_s = time.perf_counter() - sent
        assert first == b"H"
        # never sooner than the promised delay (the sim cannot answer early), and well before
        # the first token is due at 3.0 s
        assert 0.5 <= headers_s < 3.0


@pytest.mark.parametrize("flag", ["--header-delay", "--ttft"])
def test_negative_delays_are_one_line_usage_errors(flag: str) -> None:
    result = run_cli(["sim", "--port", "0", flag, "-1"], timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and flag in result.stderr
