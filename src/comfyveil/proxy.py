"""aiohttp connections, direct or through a SOCKS proxy URL such as anon's.

Our proxy URLs say ``socks5h://`` (the proxy resolves host names: `.anon` works and no
DNS query leaves this machine), the form websockets reads. python-socks reads only
``socks4``/``socks5``; for it, resolving at the proxy is ``rdns=True``.
"""

from __future__ import annotations

import re
import ssl

import aiohttp
import aiohttp_socks
import python_socks

# What a proxy that is too slow, refuses, hangs up or answers nonsense raises (besides
# aiohttp's own errors).
TIMED_OUT: tuple[type[Exception], ...] = (aiohttp_socks.ProxyTimeoutError,)
ERRORS: tuple[type[Exception], ...] = (
    aiohttp_socks.ProxyError,
    aiohttp_socks.ProxyConnectionError,
    python_socks.ProxyError,
    *TIMED_OUT,
)


def connector(
    proxy: str | None, *, limit: int, ssl_context: ssl.SSLContext | None = None
) -> aiohttp.BaseConnector:
    """A connection pool of `limit` connections, through `proxy` when one is given."""
    tls: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
    if proxy is None:
        return aiohttp.TCPConnector(limit=limit, ssl=tls)
    url = re.sub(r"^(socks[45])[ah]://", r"\1://", proxy)
    return aiohttp_socks.ProxyConnector.from_url(url, rdns=True, limit=limit, ssl=tls)
