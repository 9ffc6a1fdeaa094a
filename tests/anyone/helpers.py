"""Requests through anon with the retries a fresh hidden service needs, made with the
product's own proxy code (aiohttp over anon's Unix socket, websockets on a tunnel)."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

import aiohttp
import websockets

from comfyveil import proxy as proxy_mod
from comfyveil.anyone import process

FAILURES = (aiohttp.ClientError, *proxy_mod.ERRORS, OSError, TimeoutError)


async def _get(proxy: str, url: str, timeout: float) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession(
            connector=proxy_mod.connector(proxy, limit=1),
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as session,
        session.get(url) as response,
    ):
        return response.status, await response.read()


async def get_json(
    proxy: str, url: str, *, within: float = 90.0, anon: process.ManagedAnon | None = None
) -> dict[str, object]:
    """GET url through proxy, retrying (with NEWNYM) until it answers or time runs out."""
    deadline = time.monotonic() + within
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            status, body = await _get(proxy, url, 30)
            if status == 200:
                return json.loads(body)  # type: ignore[no-any-return]
            last = AssertionError(f"HTTP {status}")
        except FAILURES as exc:
            last = exc
        if anon is not None and anon.ready:
            await anon.new_identity()
        await asyncio.sleep(1)
    raise AssertionError(f"{url} not reachable through anon within {within} s: {last!r}")


async def refusal(proxy: str, url: str, *, timeout: float = 40) -> str:
    """Why anon refused the request, in the product's words (or, where it gave no
    hidden-service reason, the failure itself, to show in an assertion).

    Raises AssertionError if the request went through.
    """
    try:
        status, _ = await _get(proxy, url, timeout)
    except FAILURES as exc:
        return proxy_mod.refusal(exc) or f"no hidden-service reason: {exc!r}"
    raise AssertionError(f"{url} answered HTTP {status} through anon")


async def unreachable(proxy: str, url: str, *, because: int, attempts: int = 2) -> None:
    """Every attempt is refused by anon for a hidden-service reason, never served nor
    failed in some other way; the first says exactly `because` (0xF4: no client key,
    0xF5: a wrong or revoked key...).

    A later attempt may say the descriptor was not found (0xF0) instead: anon drops a
    descriptor it could not decrypt, and on a small private network the refetch can come
    back empty. Either way the service stayed closed to this client.
    """
    expected = proxy_mod.HIDDEN_SERVICE_REPLIES[because]
    allowed_later = {expected, proxy_mod.HIDDEN_SERVICE_REPLIES[0xF0]}
    for attempt in range(attempts):
        why = await refusal(proxy, url)
        wanted = {expected} if attempt == 0 else allowed_later
        assert why in wanted, (
            f"attempt {attempt + 1}: refused because {why!r}, expected {expected!r}"
        )


async def ws_echo(proxy: str, url: str, text: str) -> str:
    parts = urlsplit(url)
    sock = await proxy_mod.tunnel(proxy, parts.hostname or "", parts.port or 80, timeout=60)
    async with websockets.connect(url, sock=sock, proxy=None, open_timeout=60) as ws:
        await ws.send(text)
        reply = await asyncio.wait_for(ws.recv(), 30)
    return str(reply)
