"""HTTP to one ComfyUI backend, on aiohttp, with every transport error made one error.

aiohttp, not httpx: a worker makes three or four requests per job, and on this path
aiohttp spends about a quarter of httpx's CPU per request (measured on loopback, see
the README's design notes), which is most of what a bot serving many users pays.

Privacy: no User-Agent or Origin header; the environment's proxy variables are ignored
(``trust_env=False``); through a SOCKS proxy the host name is resolved by the proxy
(``rdns``), so `.anon` addresses work and no DNS query leaves this machine.

A backend may be hostile (notes: issue 11): every answer is read up to a cap, a read or
a write that makes no progress for `timeout` seconds fails, and a whole answer that is
not streamed must arrive within `ANSWER_DEADLINE` timeouts. What went wrong is said
plainly: a backend that was reached and then went silent "stopped answering", it is
not one that "cannot be reached".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from comfyveil import proxy as proxy_mod
from comfyveil.comfy import errors, limits

# What a dead, refusing, hanging-up or too-slow backend (or proxy in front of it) raises.
_UNREACHABLE = (aiohttp.ClientError, *proxy_mod.ERRORS, TimeoutError, OSError)
# Of those, what means the connection was never made (the rest happen after it was).
_NOT_CONNECTED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, *proxy_mod.ERRORS)
CONNECTIONS = 100  # per backend: a pool runs a handful of jobs on each, plus uploads
ANSWER_DEADLINE = 4  # a whole JSON answer may take this many `timeout`s (a trickle ends)


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


class PacedUpload(aiohttp.BytesPayload):
    """A file to upload, written in small pieces, each of which must leave within `idle`
    seconds: a backend that stops reading fails the upload instead of hanging it (aiohttp
    has no write timeout). `on_sent` hears of every piece that left."""

    def __init__(
        self,
        data: bytes,
        *,
        idle: float,
        on_sent: Callable[[int], None] | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        super().__init__(data, content_type=content_type)
        self._idle = idle
        self._on_sent = on_sent
        self.stalled = False
        self.sent = 0  # bytes handed to the connection: it was made

    async def write(self, writer: Any) -> None:
        view = memoryview(self._value)
        for start in range(0, len(view), limits.UPLOAD_CHUNK):
            piece = view[start : start + limits.UPLOAD_CHUNK]
            try:
                async with asyncio.timeout(self._idle):
                    await writer.write(piece)
            except TimeoutError:
                self.stalled = True
                # Closing would wait for the unsent bytes to leave, which they never
                # will: the socket would stay open for as long as the backend likes.
                transport = getattr(writer, "transport", None)
                if transport is not None:
                    transport.abort()
                raise
            self.sent += len(piece)
            if self._on_sent is not None:
                self._on_sent(len(piece))

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        await self.write(writer)


class Http:
    """Keep-alive HTTP to one backend, opened on first use (it needs the running loop).

    Args:
        backend: the backend's name, for error messages.
        timeout: seconds to connect, and seconds of silence while reading an answer.
        proxy: a SOCKS URL (``socks5h://user:pass@127.0.0.1:9050``), or None.
    """

    def __init__(self, *, backend: str, timeout: float, proxy: str | None = None) -> None:
        self.backend = backend
        self.timeout = timeout
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

    def _error(
        self, exc: BaseException, during: str, reached: bool, upload: PacedUpload | None
    ) -> errors.ComfyError:
        """The one error to raise for a transport failure `during` an exchange."""
        if upload is not None:
            if upload.stalled:
                return errors.BackendStopped(during, backend=self.backend)
            reached = reached or upload.sent > 0
        if isinstance(exc, _NOT_CONNECTED):
            return unreachable(self.backend, exc)
        if isinstance(exc, aiohttp.SocketTimeoutError):
            return errors.BackendStopped(during, backend=self.backend)
        if isinstance(exc, aiohttp.ClientPayloadError) or (
            reached and isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)
        ):
            return errors.BackendStopped(during, backend=self.backend, broke=True)
        return unreachable(self.backend, exc)

    @contextlib.asynccontextmanager
    async def open(
        self, method: str, url: str, *, during: str, params: Mapping[str, str] | None = None,
        json: Any = None, data: Any = None, upload: PacedUpload | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The response with its body unread, for streaming; errors while reading it
        are translated too (`during` says what was going on: "during the download";
        `upload`, the file inside `data`, tells whether it stalled).

        A body not read to its end closes the connection instead of returning it to
        the pool, where the rest of an endless answer would wait for the next request.
        """
        session = self._open_session()
        reached = False
        try:
            async with session.request(
                method, url, params=params, json=json, data=data, allow_redirects=False
            ) as response:
                reached = True
                try:
                    yield response
                except BaseException:
                    response.close()
                    raise
        except _UNREACHABLE as exc:
            raise self._error(exc, during, reached, upload) from exc

    async def request(
        self, method: str, url: str, *, during: str, what: str,
        limit: int = limits.JSON_ANSWER_BYTES, deadline: bool = True,
        params: Mapping[str, str] | None = None, json: Any = None, data: Any = None,
        upload: PacedUpload | None = None,
    ) -> Reply:
        """A whole answer of at most `limit` bytes (AnswerTooLarge beyond), within
        ANSWER_DEADLINE timeouts when `deadline` (uploads, covered by the job's own
        deadline and their inactivity timeout, pass False)."""
        seconds = self.timeout * ANSWER_DEADLINE if deadline else None
        try:
            async with (
                asyncio.timeout(seconds),
                self.open(
                    method, url, during=during, params=params, json=json, data=data,
                    upload=upload,
                ) as response,
            ):
                body = await read_capped(response, limit, what=what, backend=self.backend)
                return Reply(response.status, body)
        except TimeoutError as exc:
            raise errors.BackendStopped(
                during,
                backend=self.backend,
                message=f"backend {self.backend} took more than {seconds:.0f} s to answer {what}",
            ) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def read_capped(
    response: aiohttp.ClientResponse, limit: int, *, what: str, backend: str
) -> bytes:
    """The body of `response`, refused (AnswerTooLarge) as soon as it passes `limit`."""
    if response.content_length is not None and response.content_length > limit:
        raise errors.AnswerTooLarge(what, limit, backend=backend)
    body = bytearray()
    async for chunk in response.content.iter_chunked(limits.STREAM_CHUNK):
        body += chunk
        if len(body) > limit:
            raise errors.AnswerTooLarge(what, limit, backend=backend)
    return bytes(body)
