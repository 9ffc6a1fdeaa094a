"""Which ``Host`` a listening port answers: its own names only, so a hostile web page
cannot read it through DNS rebinding (a name of the attacker's that resolves to this
machine makes the browser send that name as Host). An IP address, ``localhost``, the
machine's own name and the names the operator configured pass; any other name is
answered 421 Misdirected Request.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable

from aiohttp import web


def name_of(header: str) -> str:
    """The host name of a Host header: no port, no brackets, lower case, no final dot."""
    host = header.strip()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".").lower()


def accepted(header: str | None, names: Iterable[str]) -> bool:
    """Whether a request with this Host is meant for us (None: a client that sent no
    Host, which no browser does)."""
    if header is None:
        return True
    host = name_of(header)
    try:
        ipaddress.ip_address(host)
        return True  # a page's origin is never this machine's address: no rebinding
    except ValueError:
        pass
    if host == "localhost" or host.endswith(".localhost"):
        return True
    return host in {name_of(n) for n in names if n}


def own_names() -> list[str]:
    """The machine's own host name, and its mDNS name (NAME.local)."""
    name = socket.gethostname()
    return [name, f"{name}.local"] if name else []


def middleware(names: Callable[[], Iterable[str]]) -> Callable[..., object]:
    """An aiohttp middleware answering 421 to a Host not among `names()` (asked on a
    refusal only: a hidden service's address may be learnt after the start)."""

    @web.middleware
    async def check_host(request: web.Request, handler: Callable[..., object]) -> object:
        header = request.headers.get("Host")
        if not accepted(header, ()) and not accepted(header, names()):
            return web.Response(
                status=421, text="Misdirected Request: this server does not answer that name.\n"
            )
        return await handler(request)  # type: ignore[misc]

    return check_host
