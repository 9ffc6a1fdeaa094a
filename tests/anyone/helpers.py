"""Requests through anon with the retries a fresh hidden service needs."""

from __future__ import annotations

import asyncio
import time

import httpx
import websockets

from comfyveil.anyone import process


async def get_json(proxy: str, url: str, *, within: float = 90.0,
                   anon: process.ManagedAnon | None = None) -> dict[str, object]:
    """GET url through proxy, retrying (with NEWNYM) until it answers or time runs out."""
    deadline = time.monotonic() + within
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            async with httpx.AsyncClient(proxy=proxy, timeout=30) as client:
                response = await client.get(url)
            response.raise_for_status()
            return response.json()  # type: ignore[no-any-return]
        except (httpx.HTTPError, OSError) as exc:
            last = exc
            if anon is not None and anon.ready:
                await anon.new_identity()
            await asyncio.sleep(1)
    raise AssertionError(f"{url} not reachable through anon within {within} s: {last!r}")


async def unreachable(proxy: str, url: str, *, attempts: int = 2) -> bool:
    """True if every attempt fails (each bounded by anon's own timeouts)."""
    for _ in range(attempts):
        try:
            async with httpx.AsyncClient(proxy=proxy, timeout=40) as client:
                await client.get(url)
        except (httpx.HTTPError, OSError):
            continue
        return False
    return True


async def ws_echo(proxy: str, url: str, text: str) -> str:
    async with websockets.connect(url, proxy=proxy, open_timeout=60) as sock:
        await sock.send(text)
        reply = await asyncio.wait_for(sock.recv(), 30)
    return str(reply)
