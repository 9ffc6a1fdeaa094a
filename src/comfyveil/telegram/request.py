"""python-telegram-bot's HTTP layer on aiohttp instead of httpx.

PTB lets a bot bring its own `BaseRequest`; this one keeps PTB's contract (form fields,
multipart uploads, `TimedOut` / `NetworkError`) and spends about a quarter of
HTTPXRequest's CPU per call, measured on loopback (see docs/develop/design-notes.md). At
one photo per job and a long poll per few updates, that is most of a busy bot's CPU.

aiohttp has no write timeout; a request's four timeouts together bound the whole call
instead, so a stalled upload still ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import urllib.parse
from collections.abc import Callable
from typing import Any

import aiohttp
import certifi
from aiohttp import hdrs
from telegram._utils.defaultvalue import DefaultValue
from telegram._utils.types import ODVInput
from telegram.error import NetworkError, TelegramError, TimedOut
from telegram.request import BaseRequest, RequestData

from comfyveil import metrics, proxy, redaction
from comfyveil.telegram import updates

_TIMED_OUT = (TimeoutError, *proxy.TIMED_OUT)
# Anything else aiohttp raises (a ValueError for a bad header) would reach PTB, which
# quotes its repr in "Unknown error in HTTP implementation: ...".
_FAILED = (aiohttp.ClientError, *proxy.ERRORS, OSError, ValueError, RuntimeError)
# The largest answer read: a file a bot may download is at most 20 MB, every other answer
# is JSON of a few kilobytes; a peer that sends more is refused, not buffered.
MAX_ANSWER_BYTES = 64 * 1024 * 1024


@functools.cache
def _trust_store() -> ssl.SSLContext:
    """The trust store httpx used (certifi); a slim system may have none of its own.
    Built once: loading it costs tens of milliseconds."""
    return ssl.create_default_context(cafile=certifi.where())


def content_disposition(name: str, filename: str) -> str:
    """A form part's Content-Disposition naming its file as RFC 6266 does: the name as a
    quoted string, and again as ``filename*`` (UTF-8, percent-encoded) when it is not
    plain ASCII. aiohttp's own percent-encodes the quoted name, which Telegram shows as is
    ("my%20cat.png")."""

    def quoted(text: str) -> str:
        text = "".join(c if c.isprintable() else "_" for c in text)
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    header = f"form-data; name={quoted(name)}; filename={quoted(filename)}"
    if not filename.isascii():
        header += "; filename*=UTF-8''" + urllib.parse.quote(filename, safe="")
    return header


def multipart(fields: dict[str, Any], files: dict[str, Any]) -> aiohttp.MultipartWriter:
    """The multipart/form-data body of a Bot API call with files."""
    writer = aiohttp.MultipartWriter("form-data")
    for key, value in fields.items():
        part = writer.append(str(value))
        part.set_content_disposition("form-data", name=key)
    for name, (filename, content, mimetype) in files.items():
        part = writer.append(content, {hdrs.CONTENT_TYPE: mimetype})
        part.headers[hdrs.CONTENT_DISPOSITION] = content_disposition(name, filename)
    return writer


class AiohttpRequest(BaseRequest):
    """Bot API requests over one aiohttp session, opened by `initialize`.

    Args:
        connection_pool_size: connections kept to the Bot API.
        read_timeout, write_timeout, connect_timeout, pool_timeout: PTB's defaults, in
            seconds, used when a call passes none.
        media_write_timeout: the write timeout of a call that uploads a file.
        proxy: a proxy URL (``socks5h://127.0.0.1:9050`` for anon); host names are then
            resolved by the proxy.
    """

    __slots__ = (
        "_answered", "_defaults", "_failing", "_handling", "_media_write_timeout", "_pool_size",
        "_proxy", "_refused", "_session",
    )

    def __init__(
        self,
        *,
        connection_pool_size: int = 256,
        read_timeout: float | None = 5.0,
        write_timeout: float | None = 5.0,
        connect_timeout: float | None = 5.0,
        pool_timeout: float | None = 1.0,
        media_write_timeout: float | None = 20.0,
        proxy: str | None = None,
        handling: updates.Handling | None = None,
        answered: Callable[[], None] | None = None,
    ) -> None:
        """`handling`: for the getUpdates request, the updates still being handled, which
        its polls leave unconfirmed (see `updates.Handling`); `answered`: called when
        the Bot API answers a call again after failing (or not answering) the last one:
        an outage is over."""
        self._answered = answered
        self._failing = False
        self._pool_size = connection_pool_size
        self._handling = handling
        self._defaults = (read_timeout, write_timeout, connect_timeout, pool_timeout)
        self._media_write_timeout = media_write_timeout
        self._proxy = proxy
        self._session: aiohttp.ClientSession | None = None
        self._refused = False

    def refuse_polling(self) -> None:
        """Answer every later call (the getUpdates of this request object) with no
        updates, without asking Telegram: another process polls the bot, and one more
        poll, PTB's last one on stop included, would cut that process's off in turn."""
        self._refused = True

    @property
    def read_timeout(self) -> float | None:
        return self._defaults[0]

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=proxy.connector(self._proxy, limit=self._pool_size,
                                          ssl_context=_trust_store()),
                trust_env=False,
            )

    async def shutdown(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    def _timeout(self, read: Any, write: Any, connect: Any, pool: Any, upload: bool) -> Any:
        default_read, default_write, default_connect, default_pool = self._defaults
        read = default_read if isinstance(read, DefaultValue) else read
        if isinstance(write, DefaultValue):
            write = self._media_write_timeout if upload else default_write
        connect = default_connect if isinstance(connect, DefaultValue) else connect
        pool = default_pool if isinstance(pool, DefaultValue) else pool
        parts = (read, write, connect, pool)
        return aiohttp.ClientTimeout(
            total=None if None in parts else sum(parts),
            connect=None if pool is None or connect is None else pool + connect,
            sock_connect=connect,
            sock_read=read,
        )

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        write_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        connect_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        pool_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        if self._refused:
            return 200, b'{"ok": true, "result": []}'
        if self._session is None or self._session.closed:
            raise RuntimeError("this AiohttpRequest is not initialized")
        files = request_data.multipart_data if request_data else None
        fields = request_data.json_parameters if request_data else None
        wanted: int | None = None
        if self._handling is not None and fields is not None and _method(url) == "getUpdates":
            with contextlib.suppress(ValueError):
                wanted = int(fields.get("offset") or 0)
                fields = {**fields, "offset": str(self._handling.floor(wanted))}
        body: Any = fields
        if files:
            body = multipart(fields or {}, files)
        timeout = self._timeout(read_timeout, write_timeout, connect_timeout, pool_timeout,
                                upload=bool(files))
        failure: TelegramError
        try:
            async with self._session.request(
                method, url, data=body, timeout=timeout,
                headers={"User-Agent": self.USER_AGENT}, allow_redirects=False,
            ) as response:
                body = await _read_at_most(response, MAX_ANSWER_BYTES)
                metrics.telegram_request(_method(url), _outcome(response.status))
                if response.status == 200 and self._failing and self._answered is not None:
                    self._answered()
                self._failing = response.status >= 500 or response.status == 429
                if response.status == 200 and _method(url) == "getUpdates":
                    body = updates.readable(body)
                    if self._handling is not None and wanted is not None:
                        body, stale_only = self._handling.fetched(body, wanted)
                        if stale_only:
                            await asyncio.sleep(updates.STALE_PAUSE_S)
                return response.status, body
        except _TIMED_OUT:
            failure = TimedOut()
        except _FAILED as exc:
            failure = NetworkError(_describe(exc))
        metrics.telegram_request(_method(url), "network")
        self._failing = True
        # Raised here, outside the handler, so the error has no cause and no context:
        # aiohttp's errors quote the URL, which holds the bot token, and a traceback
        # prints every exception of the chain.
        raise failure


class AnswerTooLarge(NetworkError):
    """The Bot API (or what answers in its place) sent more than any answer may hold."""


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The answer's body, refused past `limit` bytes without reading further."""
    if response.content_length is not None and response.content_length > limit:
        raise AnswerTooLarge(f"the answer is {response.content_length} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(f"the answer is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _method(url: str) -> str:
    """The Bot API method of `url` for the metrics: never the token before it, and for a
    file download never the file's path ("file")."""
    if "/file/bot" in url:
        return "file"
    method = url.rsplit("/", 1)[-1].split("?", 1)[0]
    return method if method.isascii() and method.isalpha() and len(method) <= 40 else "other"


def _outcome(status: int) -> str:
    return "ok" if status == 200 else "retry_after" if status == 429 else "error"


def _describe(exc: BaseException) -> str:
    """What failed, without the URL: the class name, and for an answer that was not
    HTTP, aiohttp's status and message (they never hold the URL)."""
    name = f"aiohttp.{type(exc).__name__}"
    if isinstance(exc, aiohttp.ClientResponseError):
        first_line = str(exc.message).splitlines()[0] if exc.message else ""
        return redaction.redact(f"{name}: {exc.status} {first_line}".rstrip())
    return name
