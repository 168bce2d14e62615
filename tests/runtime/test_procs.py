from __future__ import annotations

import asyncio
import time

from metrale.runtime.procs import CappedBuffer, Limits, RateLimiter, allowed_env


def test_capped_buffer_keeps_head_and_tail_and_counts_the_rest() -> None:
    buf = CappedBuffer(10)
    for chunk in (b"abc", b"defgh", b"x" * 100, b"12345"):
        buf.add(chunk)
    assert buf.total == 113
    assert bytes(buf.head) == b"abcde"
    assert buf.dropped == 103
    text = buf.text()
    assert text.startswith("abcde") and text.endswith("12345")
    assert "103 bytes dropped" in text


def test_capped_buffer_under_cap_is_verbatim() -> None:
    buf = CappedBuffer(100)
    buf.add(b"hello ")
    buf.add(b"world")
    assert buf.text() == "hello world" and buf.dropped == 0


def test_allowed_env_keeps_only_the_allow_list() -> None:
    env = {
        "PATH": "/bin",
        "OPENAI_API_KEY": "s",
        "GITHUB_TOKEN": "s",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_ACCESS_KEY_ID": "s",
        "DATABASE_URL": "postgres://u:p@h/db",
        "GH_PAT": "s",
        "SSH_AUTH_SOCK": "/tmp/agent.sock",
        "HOME": "/root",
        "LANG": "C",
    }
    assert allowed_env(env) == {"PATH": "/bin", "LANG": "C"}


def test_limits_prlimit_argv() -> None:
    unlimited = Limits(cpu_s=None, memory_mb=None, max_procs=None, file_size_mb=None)
    assert unlimited.prlimit_argv() == []
    argv = Limits(cpu_s=5, memory_mb=64, max_procs=7, file_size_mb=None).prlimit_argv()
    assert argv == ["/usr/bin/prlimit", "--cpu=5", f"--as={64 << 20}", "--nproc=7", "--"]


def test_rate_limiter_spaces_acquisitions() -> None:
    async def main() -> float:
        limiter = RateLimiter(50.0)
        started = time.perf_counter()
        await asyncio.gather(*(limiter.acquire() for _ in range(6)))
        return time.perf_counter() - started

    assert asyncio.run(main()) >= 5 / 50 - 0.01
