"""Before any work: is the target an OpenAI-compatible server that serves the model?

`probe` turns every way a target can be wrong into one line (a `UsageError`): connection
refused, a host that does not resolve, a server that does not speak the OpenAI API, a model it
does not serve. `preflight` asks the model what 2+2 is; a wrong answer is a warning, not a
failure, since a tiny model may well get it wrong.
"""

from __future__ import annotations

import asyncio
import re
import socket
from urllib.parse import urlsplit

from pydantic import BaseModel

from metrale.endpoint.client import ChatClient, ClientOptions, EndpointError, Target
from metrale.endpoint.http import ConnectionPool, HttpConnectionError, HttpProtocolError
from metrale.errors import UsageError

ACCEPTED = "an OpenAI-compatible base URL such as http://127.0.0.1:8000/v1"


class ProbeResult(BaseModel):
    base_url: str
    models: list[str]
    model: str


class Preflight(BaseModel):
    ok: bool
    answer: str = ""
    latency_s: float | None = None
    error: str | None = None


#: The most of a `GET /models` answer read (a server listing thousands of models fits).
MODELS_MAX_BYTES = 8 << 20


async def probe(
    url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 10.0
) -> ProbeResult:
    """GET {base}/models and choose the model; raise `UsageError` with one line otherwise."""
    base = Target.normalize_url(url)
    try:
        parts = urlsplit(base)
        parts.port  # noqa: B018 - a bad port raises here, not in the first call
    except ValueError as exc:
        raise UsageError(
            f"target {url!r} is not a valid URL ({exc}); accepted: {ACCEPTED}"
        ) from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise UsageError(f"target {url!r} is not an http(s) URL; accepted: {ACCEPTED}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # metrale's own HTTP client, not aiohttp: importing aiohttp cost ~100 ms of every run's
    # start-up, for this one GET
    pool = ConnectionPool(base, headers)
    try:
        async with asyncio.timeout(timeout_s):
            resp = await pool.get("/models")
            body = await resp.read(max_bytes=MODELS_MAX_BYTES)
            resp.release()
        status = resp.status
        text = body.decode("utf-8", errors="replace")
    except HttpConnectionError as exc:
        cause = exc.__cause__
        if isinstance(cause, socket.gaierror):
            raise UsageError(f"cannot resolve host {parts.hostname!r} of target {url}") from None
        if cause is None:
            raise UsageError(f"cannot talk to target {url}: {exc}") from None
        reason = (
            "connection refused"
            if isinstance(cause, ConnectionRefusedError)
            else getattr(cause, "strerror", None) or str(cause)
        )
        raise UsageError(
            f"cannot connect to target {url}: {reason} "
            "(is the server running? pass --target with a reachable URL)"
        ) from None
    except TimeoutError:
        raise UsageError(
            f"target {url} did not answer GET /models within {timeout_s:g} s"
        ) from None
    except (HttpProtocolError, OSError) as exc:
        raise UsageError(f"cannot talk to target {url}: {type(exc).__name__}: {exc}") from None
    finally:
        await pool.close()
    if status in (401, 403):
        raise UsageError(
            f"target {url} refused the API key (HTTP {status}); "
            "pass --api-key or set OPENAI_API_KEY"
        )
    served = _parse_models(text) if status == 200 else None
    if served is None:
        snippet = re.sub(r"\s+", " ", text)[:80]
        raise UsageError(
            f"target {url} is not an OpenAI-compatible server: GET {base}/models answered "
            f"HTTP {status} {snippet!r}; accepted: {ACCEPTED}"
        )
    if model is None:
        if not served:
            raise UsageError(f"target {url} serves no model; pass --model NAME")
        model = served[0]
    elif served and model not in served:
        raise UsageError(f"model {model!r} is not served by {url}; it serves: {', '.join(served)}")
    return ProbeResult(base_url=base, models=served, model=model)


def _parse_models(text: str) -> list[str] | None:
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return None
    return [m["id"] for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]


PREFLIGHT_PROMPT = "What is 2+2? Reply with the number only."


async def preflight(target: Target, options: ClientOptions | None = None) -> Preflight:
    """Ask the model what 2+2 is; `ok` says whether a 4 stands alone in its answer."""
    opts = (options or ClientOptions()).model_copy(update={"retries": 1})
    try:
        async with ChatClient(target, opts) as client:
            call = await client.chat(
                [{"role": "user", "content": PREFLIGHT_PROMPT}], max_tokens=16, temperature=0.0
            )
    except EndpointError as exc:
        return Preflight(ok=False, error=f"{exc.kind}: {exc}")
    answer = call.content.strip()
    return Preflight(
        ok=bool(re.search(r"(?<![\d.])4(?![\d.]*\d)", answer)),
        answer=answer[:200],
        latency_s=call.latency_s,
    )
