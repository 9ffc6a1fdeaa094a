"""Connections through a SOCKS proxy such as anon's: aiohttp pools and bare tunnels.

Our proxy URLs say ``socks5h://`` (the proxy resolves host names: `.anon` works and no
DNS query leaves this machine). A proxy on a Unix socket is written as curl writes it:
host ``localhost`` and the socket's absolute path as the URL's path,
``socks5h://user:pass@localhost/home/me/.local/share/comfyveil/anon/state/socks.sock``;
a TCP proxy has no path (``socks5h://user:pass@127.0.0.1:9050``). Our own anon listens
only on a Unix socket inside its 0700 state directory, so no other local user can use
its circuits (and the client keys loaded in it) or take its port while it restarts.

python-socks speaks the SOCKS protocol for both; over a Unix socket it is handed the
connected socket through its `forward` hook (the one it uses for proxy chains).
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiohttp
import aiohttp_socks
import python_socks
from aiohttp.client_proto import ResponseHandler
from python_socks.async_.asyncio import Proxy as SocketProxy

# What a proxy that is too slow, refuses, hangs up or answers nonsense raises (besides
# aiohttp's own errors).
TIMED_OUT: tuple[type[Exception], ...] = (
    aiohttp_socks.ProxyTimeoutError,
    python_socks.ProxyTimeoutError,
)
ERRORS: tuple[type[Exception], ...] = (
    aiohttp_socks.ProxyError,
    aiohttp_socks.ProxyConnectionError,
    python_socks.ProxyError,
    python_socks.ProxyConnectionError,
    *TIMED_OUT,
)
_INVALID_REPLY = re.compile(r"[Ii]nvalid reply code: 0[Xx]([0-9A-Fa-f]{2})\b")
UNIX_HOST = "localhost"  # the host of a Unix-socket proxy URL (curl's convention)

# Tor's (and anon's) SOCKS5 replies for hidden services with the ExtendedErrors flag:
# why a hidden backend refused us, in words a user can act on.
HIDDEN_SERVICE_REPLIES = {
    0xF0: "is not published: its hidden-service descriptor was not found "
    "(is anon running on the GPU host?)",
    0xF1: "published an invalid hidden-service descriptor",
    0xF2: "could not be reached: the introduction to its hidden service failed",
    0xF3: "could not be reached: the rendezvous with its hidden service failed",
    0xF4: "needs a client key (auth_key_file)",
    0xF5: "refused our client key (auth_key_file): it is wrong or was revoked",
    0xF6: "has an invalid hidden-service address (check its url)",
    0xF7: "did not answer: the introduction to its hidden service timed out",
}


@dataclass(frozen=True)
class Socks:
    """A parsed proxy URL. `unix_path` is set for a proxy on a Unix socket."""

    scheme: str  # socks5h, socks5, socks4a, socks4
    host: str
    port: int
    unix_path: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> Socks:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in {"socks5h", "socks5", "socks4a", "socks4"}:
            raise ValueError(f"not a SOCKS proxy URL: {scheme}://...")
        user = unquote(parts.username) if parts.username is not None else None
        password = unquote(parts.password) if parts.password is not None else None
        host = parts.hostname or ""
        if parts.path not in ("", "/"):
            if host != UNIX_HOST or parts.port is not None:
                raise ValueError(f"a Unix-socket proxy URL has the host {UNIX_HOST}")
            return cls(scheme, host, 0, unquote(parts.path), user, password)
        if not host or parts.port is None:
            raise ValueError("a SOCKS proxy URL needs a host and a port")
        return cls(scheme, host, parts.port, None, user, password)

    @property
    def proxy_type(self) -> python_socks.ProxyType:
        return (
            python_socks.ProxyType.SOCKS5
            if self.scheme.startswith("socks5")
            else (python_socks.ProxyType.SOCKS4)
        )

    @property
    def rdns(self) -> bool:
        """Resolve at the proxy: always, for our URLs (socks5 and socks5h alike)."""
        return True


def unix_url(path: str, username: str, password: str) -> str:
    """The socks5h:// URL of a proxy listening on the Unix socket `path` (absolute)."""
    return (
        f"socks5h://{quote(username, safe='')}:{quote(password, safe='')}@{UNIX_HOST}{quote(path)}"
    )


class _UnixForward:
    """python-socks' `forward` hook: hands it a stream connected to the proxy's socket."""

    def __init__(self, path: str) -> None:
        self._path = path

    async def connect(
        self, dest_host: str, dest_port: int, timeout: float | None = None, **_: Any
    ) -> socket.socket:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, self._path)
        except OSError as exc:
            sock.close()
            raise python_socks.ProxyConnectionError(
                exc.errno, f"cannot connect to the proxy's socket [{exc.strerror}]"
            ) from exc
        except BaseException:
            sock.close()
            raise
        return sock


def _socket_proxy(parsed: Socks) -> SocketProxy:
    forward = _UnixForward(parsed.unix_path) if parsed.unix_path else None
    return SocketProxy(
        parsed.proxy_type,
        parsed.host or UNIX_HOST,
        parsed.port,
        parsed.username,
        parsed.password,
        parsed.rdns,
        forward=forward,
    )  # type: ignore[arg-type]


async def tunnel(proxy: str, host: str, port: int, *, timeout: float) -> socket.socket:
    """A socket connected to host:port through the proxy (the name goes to the proxy).

    Raises python-socks' errors (see ERRORS) when the proxy refuses or is not there.
    """
    return await _socket_proxy(Socks.parse(proxy)).connect(host, port, timeout=timeout)


class UnixProxyConnector(aiohttp_socks.ProxyConnector):
    """aiohttp_socks' connector, with the proxy on a Unix socket."""

    def __init__(self, parsed: Socks, **kwargs: Any) -> None:
        super().__init__(
            host=parsed.host,
            port=parsed.port,
            proxy_type=parsed.proxy_type,
            username=parsed.username,
            password=parsed.password,
            rdns=parsed.rdns,
            **kwargs,
        )
        self._parsed = parsed

    async def _connect_via_proxy(
        self,
        host: str,
        port: int,
        ssl: ssl.SSLContext | None = None,
        timeout: float | None = None,
    ) -> tuple[asyncio.Transport, ResponseHandler]:
        sock = await _socket_proxy(self._parsed).connect(host, port, timeout=timeout)
        try:
            transport, protocol = await self._loop.create_connection(
                lambda: ResponseHandler(self._loop),
                sock=sock,
                ssl=ssl,
                server_hostname=host if ssl else None,
            )
        except BaseException:
            sock.close()
            raise
        return transport, protocol  # type: ignore[return-value]


def connector(
    proxy: str | None, *, limit: int, ssl_context: ssl.SSLContext | None = None
) -> aiohttp.BaseConnector:
    """A connection pool of `limit` connections, through `proxy` when one is given."""
    tls: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
    if proxy is None:
        return aiohttp.TCPConnector(limit=limit, ssl=tls)
    parsed = Socks.parse(proxy)
    if parsed.unix_path:
        return UnixProxyConnector(parsed, limit=limit, ssl=tls)
    # python-socks reads only socks4/socks5; resolving at the proxy is rdns=True.
    url = re.sub(r"^(socks[45])[ah]://", r"\1://", proxy)
    return aiohttp_socks.ProxyConnector.from_url(url, rdns=True, limit=limit, ssl=tls)


def refusal(exc: BaseException) -> str | None:
    """Why a hidden service refused us, from the proxy's extended SOCKS error in `exc`
    or its causes ("needs a client key (auth_key_file)"); None when it says nothing."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "error_code", None)
        if not isinstance(code, int):
            # python-socks 3.2 knows only RFC 1928's codes and raises "Invalid reply
            # code: 0XF4" for anon's, without an error_code.
            match = _INVALID_REPLY.search(str(current))
            code = int(match.group(1), 16) if match else None
        if code in HIDDEN_SERVICE_REPLIES:
            return HIDDEN_SERVICE_REPLIES[code]
        current = current.__cause__ or current.__context__
    return None
