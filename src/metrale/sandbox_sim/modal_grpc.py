"""The gRPC plumbing of the modal emulator: a grpclib service of every method of one of
`modal_proto`'s service bases (those it lacks answer UNIMPLEMENTED naming themselves), a server
whose connections allow as many streams as a thousand sandboxes need, and the router tokens.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

if TYPE_CHECKING:
    from grpclib.server import Server, Stream

logger = logging.getLogger(__name__)


#: HTTP/2 streams one client connection may hold open at once. h2's default (100) would make
#: the emulator, not the service it stands for, the bound at 1,024 sandboxes: the SDK sends
#: every control-plane call over one connection, and a V2 creation holds its stream while
#: pending.
MAX_STREAMS = 65536


def wide_server(services: list[Any]) -> Server:
    """A grpclib server whose connections allow `MAX_STREAMS` streams (grpclib offers no
    setting: its protocol's `connection_made` is extended, a private API of the version the
    pinned SDK brings)."""
    from grpclib.protocol import H2Protocol
    from grpclib.server import Server
    from h2.settings import SettingCodes

    class WideProtocol(H2Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            h2_connection = self.connection._connection
            h2_connection.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS})
            self.connection.flush()

    class WideServer(Server):
        def _protocol_factory(self) -> H2Protocol:
            made = super()._protocol_factory()
            return WideProtocol(made.handler, made.config, made.h2_config)

    return WideServer(services)


def make_jwt(claims: dict[str, Any]) -> str:
    """An unsigned JWT with an expiry an hour away (the SDK reads `exp` to know when to
    refresh; nothing here verifies the signature, the router compares the whole token)."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    body = {**claims, "exp": int(time.time()) + 3600, "nonce": secrets.token_hex(8)}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(body)}.sig"


def service(base: type, impl: Any, check: Callable[[Any], None] | None, missing: list[str]) -> Any:
    """A grpclib service of every method of `base`: `impl`'s where it has one, else a handler
    that answers UNIMPLEMENTED naming the method (and logs it)."""
    methods = {}
    for name in base.__abstractmethods__:  # type: ignore[attr-defined]
        found = getattr(impl, name, None)
        methods[name] = _guarded(found, check) if found else _unimplemented(missing, name)
    proxy = types.SimpleNamespace(**methods)

    class Service:
        def __mapping__(self) -> dict[str, Any]:
            mapping: dict[str, Any] = base.__mapping__(proxy)  # type: ignore[attr-defined]
            return mapping

    return Service()


def _guarded(handler: Any, check: Callable[[Any], None] | None) -> Any:
    async def call(stream: Stream[Any, Any]) -> None:
        if check is not None:
            check(stream)
        await handler(stream)

    return call


def _unimplemented(missing: list[str], name: str) -> Any:
    async def call(stream: Stream[Any, Any]) -> None:
        logger.error("modal emulator: %s is not implemented", name)
        missing.append(name)
        raise GRPCError(Status.UNIMPLEMENTED, f"modal emulator: {name} is not implemented")

    return call
