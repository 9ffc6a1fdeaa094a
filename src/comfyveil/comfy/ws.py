"""The WebSocket of one backend: one client_id, its events fanned out to the prompts
that listen for them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from comfyveil import proxy as proxy_mod
from comfyveil.comfy import errors, events, transport

# The name it logged under before the client was split, so log lines read as before.
log = logging.getLogger("comfyveil.comfy.client")

LOST = object()  # queued to listeners when the socket dies


class Socket:
    """One WebSocket with its own client_id, fanning events out to listeners."""

    def __init__(self, client_id: str, conn: ClientConnection, backend: str) -> None:
        self.client_id = client_id
        self.conn = conn
        self.backend = backend
        self.listeners: dict[str, asyncio.Queue[Any]] = {}
        self.current_prompt: str | None = None
        self.alive = True
        self.reader = asyncio.create_task(self._read(), name=f"comfy-ws-{backend}")

    def listen(self, prompt_id: str) -> asyncio.Queue[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.listeners[prompt_id] = queue
        if not self.alive:
            queue.put_nowait(LOST)
        return queue

    def unlisten(self, prompt_id: str) -> None:
        self.listeners.pop(prompt_id, None)

    async def _read(self) -> None:
        try:
            async for frame in self.conn:
                try:
                    event = (
                        events.parse_binary(frame)
                        if isinstance(frame, bytes)
                        else events.parse_text(frame)
                    )
                except errors.BackendProtocolError:
                    log.warning("backend %s sent an unreadable message", self.backend)
                    continue
                self._route(event)
        except websockets.ConnectionClosed:
            pass
        except Exception:  # the reader must never die silently
            log.exception("WebSocket reader for backend %s failed", self.backend)
        finally:
            self.alive = False
            for queue in self.listeners.values():
                queue.put_nowait(LOST)

    def _route(self, event: events.Event) -> None:
        arrived = time.monotonic()
        pid = event.prompt_id
        if isinstance(event, events.ExecutionStart):
            self.current_prompt = pid
        if pid is None:
            if isinstance(event, events.Status):
                for queue in self.listeners.values():
                    queue.put_nowait((arrived, event))
                return
            pid = self.current_prompt  # legacy previews and text carry no prompt id
        if isinstance(event, events.Executing) and event.node is None:
            self.current_prompt = None
        if pid is not None and pid in self.listeners:
            self.listeners[pid].put_nowait((arrived, event))

    async def close(self) -> None:
        self.alive = False
        with contextlib.suppress(Exception):
            await self.conn.close()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader


def _host_port(ws_url: str) -> tuple[str, int]:
    parts = urlsplit(ws_url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "wss" else 80)


async def connect(base_url: str, *, proxy: str | None, timeout: float, backend: str) -> Socket:
    """Open a WebSocket with a fresh client_id; BackendUnreachable if it cannot be opened."""
    client_id = uuid.uuid4().hex
    url = re.sub(r"^http", "ws", base_url) + f"/ws?clientId={client_id}"
    try:
        # Through a proxy, python-socks opens the tunnel (also over anon's Unix socket,
        # which websockets cannot dial) and websockets gets the connected socket.
        sock = await proxy_mod.tunnel(proxy, *_host_port(url), timeout=timeout) if (
            proxy) else None
        conn = await ws_connect(
            url,
            origin=None,
            proxy=None,  # never the environment's proxy
            sock=sock,
            open_timeout=timeout,
            close_timeout=min(timeout, 5.0),
            max_size=None,
            compression=None,
            user_agent_header=None,
        )
    except (OSError, TimeoutError, websockets.InvalidHandshake, *proxy_mod.ERRORS) as exc:
        raise transport.unreachable(backend, exc) from exc
    try:
        await conn.send('{"type":"feature_flags","data":{"supports_preview_metadata":true}}')
    except websockets.ConnectionClosed as exc:
        raise errors.BackendUnreachable(backend=backend) from exc
    return Socket(client_id, conn, backend)
