"""Small network helpers shared by layers that must not import each other."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1", *, avoid: set[int] | None = None) -> int:
    """A TCP port nothing listens on now, on `host`; not one of `avoid` (ports already handed
    to a concurrent user, who may not have bound them yet), which it is added to."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if avoid is None:
            return port
        if port not in avoid:
            avoid.add(port)
            return port
    raise OSError("no free TCP port found in 64 tries")
