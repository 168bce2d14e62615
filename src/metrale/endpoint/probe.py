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
import ssl
from urllib.parse import urlsplit

from pydantic import BaseModel

from metrale.endpoint.client import ChatClient, ClientOptions, EndpointError, Target
from metrale.endpoint.http import ConnectionPool, HttpConnectionError, HttpProtocolError
from metrale.errors import UsageError

ACCEPTED = "an OpenAI-compatible base URL such as http://127.0.0.1:8000/v1"
#: A model list is small; a server that sends more than this is not the one we want.
MAX_MODELS_BYTES = 4 * 1024 * 1024


class ProbeResult(BaseModel):
    base_url: str
    models: list[str]
    model: str


class Preflight(BaseModel):
    ok: bool
    answer: str = ""
    latency_s: float | None = None
    error: str | None = None


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
    pool = ConnectionPool(base, headers)
    try:
        async with asyncio.timeout(timeout_s):
            resp = await pool.get("/models")
            try:
                status = resp.status
                text = (await resp.read(MAX_MODELS_BYTES)).decode(errors="replace")
            finally:
                resp.release()
    except HttpConnectionError as exc:
        raise UsageError(_connect_failure(url, parts.hostname, exc)) from None
    except TimeoutError:
        raise UsageError(
            f"target {url} did not answer GET /models within {timeout_s:g} s"
        ) from None
    except HttpProtocolError as exc:
        raise UsageError(
            f"target {url} is not an OpenAI-compatible server: GET {base}/models got a broken "
            f"HTTP response ({exc}); accepted: {ACCEPTED}"
        ) from None
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


def _connect_failure(url: str, host: str, exc: HttpConnectionError) -> str:
    """One line for a target that cannot be reached: unresolvable, refused, TLS, or dropped."""
    err = exc.os_error
    if isinstance(err, socket.gaierror):
        return f"cannot resolve host {host!r} of target {url}"
    if isinstance(err, ConnectionRefusedError):
        reason = "connection refused"
    elif isinstance(err, ssl.SSLError):
        reason = f"TLS failed: {err.reason or err}"
    elif err is not None:
        reason = err.strerror or str(err)
    else:
        return f"cannot talk to target {url}: {exc}"
    return (
        f"cannot connect to target {url}: {reason} "
        "(is the server running? pass --target with a reachable URL)"
    )


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
