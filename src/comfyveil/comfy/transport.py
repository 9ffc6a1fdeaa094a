"""HTTP to one ComfyUI backend, on aiohttp, with every transport error made one error.

aiohttp, not httpx: a worker makes three or four requests per job, and on this path
aiohttp spends about a quarter of httpx's CPU per request (measured on loopback, see
the README's design notes), which is most of what a bot serving many users pays.

Privacy: no User-Agent or Origin header; the environment's proxy variables are ignored
(``trust_env=False``); through a SOCKS proxy the host name is resolved by the proxy
(``rdns``), so `.anon` addresses work and no DNS query leaves this machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from comfyveil import proxy as proxy_mod
from comfyveil.comfy import errors

# What a dead, refusing, hanging-up or too-slow backend (or proxy in front of it) raises.
_UNREACHABLE = (aiohttp.ClientError, *proxy_mod.ERRORS, TimeoutError, OSError)
CONNECTIONS = 100  # per backend: a pool runs a handful of jobs on each, plus uploads


def unreachable(backend: str, exc: BaseException) -> errors.BackendUnreachable:
    """The error for a failed connection; when anon said why a hidden backend refused
    us, its words: "backend cloud needs a client key (auth_key_file)"."""
    why = proxy_mod.refusal(exc)
    return errors.BackendUnreachable(f"backend {backend} {why}" if why else None,
                                     backend=backend)


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole answer: status and body, read before the connection went back to the pool."""

    status: int
    body: bytes = field(repr=False)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class Http:
    """Keep-alive HTTP to one backend, opened on first use (it needs the running loop).

    Args:
        backend: the backend's name, for error messages.
        timeout: seconds to connect, and seconds of silence while reading an answer.
        proxy: a SOCKS URL (``socks5h://user:pass@127.0.0.1:9050``), or None.
    """

    def __init__(self, *, backend: str, timeout: float, proxy: str | None = None) -> None:
        self.backend = backend
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout, sock_read=timeout)
        self._proxy = proxy
        self._session: aiohttp.ClientSession | None = None

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=proxy_mod.connector(self._proxy, limit=CONNECTIONS),
                timeout=self._timeout,
                trust_env=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    @contextlib.asynccontextmanager
    async def open(
        self, method: str, url: str, *, params: Mapping[str, str] | None = None,
        json: Any = None, data: Any = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The response with its body unread, for streaming; errors while reading it
        are translated too."""
        session = self._open_session()
        try:
            async with session.request(
                method, url, params=params, json=json, data=data, allow_redirects=False
            ) as response:
                yield response
        except _UNREACHABLE as exc:
            raise unreachable(self.backend, exc) from exc

    async def request(
        self, method: str, url: str, *, params: Mapping[str, str] | None = None,
        json: Any = None, data: Any = None,
    ) -> Reply:
        async with self.open(method, url, params=params, json=json, data=data) as response:
            return Reply(response.status, await response.read())

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
