"""The WebSocket of one backend: one client_id, its events fanned out to the prompts
that listen for them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
import uuid
from typing import Any
from urllib.parse import urlencode, urlsplit

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.client import ClientProtocol
from websockets.frames import CloseCode, Opcode

from comfyveil import proxy as proxy_mod
from comfyveil.comfy import errors, events, limits, transport

# The name it logged under before the client was split, so log lines read as before.
log = logging.getLogger("comfyveil.comfy.client")

LOST = object()  # queued to listeners when the socket dies


class _TypedLimits(ClientProtocol):
    """websockets' protocol with one size cap for text messages and another for binary.

    websockets has one `max_size` for both, read before each frame's header is parsed;
    at that point the frame's first byte (FIN and opcode) is already buffered, because
    the parser waits for data before it asks for the cap. So the cap is chosen by that
    byte: a text event is a few KB, while a binary frame may carry a full image. A
    frame over its cap is refused from its header, before its payload is read.

    This leans on how websockets 17's `Protocol.parse` orders its reads;
    tests/integration/test_hostile_backend.py fails if a new version changes that.
    """

    text_limit: int = limits.WS_TEXT_BYTES
    binary_limit: int = limits.Limits().ws_binary_bytes
    _message_opcode: Opcode = Opcode.TEXT

    @property  # type: ignore[override]
    def max_message_size(self) -> int:
        buffer = self.reader.buffer
        opcode = buffer[0] & 0x0F if buffer else Opcode.CONT  # (never empty, see above)
        if opcode in (Opcode.TEXT, Opcode.BINARY):
            self._message_opcode = Opcode(opcode)
        elif opcode != Opcode.CONT:
            return self.text_limit  # control frames: 125 bytes at most anyway
        return self.binary_limit if self._message_opcode is Opcode.BINARY else self.text_limit

    @max_message_size.setter
    def max_message_size(self, value: int | None) -> None:
        pass  # set by the base class from `max_size`; the limits above rule instead


class _CappedConnection(ClientConnection):
    """A connection whose protocol refuses oversized messages by type (`_TypedLimits`)."""

    binary_limit = limits.Limits().ws_binary_bytes

    def __init__(self, protocol: ClientProtocol, *args: Any, **kwargs: Any) -> None:
        # websockets builds the protocol itself and hands it here, the one hook it has:
        # its class becomes the subclass (same layout, one property more).
        protocol.__class__ = _TypedLimits
        assert isinstance(protocol, _TypedLimits)
        protocol.binary_limit = self.binary_limit
        super().__init__(protocol, *args, **kwargs)


@functools.cache  # one class per distinct limit, not one per connection
def _connection_class(limit: limits.Limits) -> type[_CappedConnection]:
    return type("CappedConnection", (_CappedConnection,), {"binary_limit": limit.ws_binary_bytes})


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
        except websockets.ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == CloseCode.MESSAGE_TOO_BIG:
                log.warning(
                    "backend %s sent a WebSocket message over the size limit; "
                    "following its jobs without events",
                    self.backend,
                )
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


async def connect(
    base_url: str,
    *,
    proxy: str | None,
    timeout: float,
    backend: str,
    limit: limits.Limits | None = None,
    client_id: str | None = None,
) -> Socket:
    """Open a WebSocket with a fresh client_id (or a given one, to take over the events of
    a prompt posted with it); BackendUnreachable if it cannot be opened.

    Text messages over `limits.WS_TEXT_BYTES` and binary ones over what `limit` allows
    close the socket (the jobs on it go on by polling) instead of filling memory.
    """
    client_id = client_id or uuid.uuid4().hex
    url = re.sub(r"^http", "ws", base_url) + "/ws?" + urlencode({"clientId": client_id})
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
            max_size=limits.WS_TEXT_BYTES,  # the per-type caps of _TypedLimits rule
            create_connection=_connection_class(limit or limits.Limits()),
            # Frames waiting for our reader: each may be as large as an output.
            max_queue=4,
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
