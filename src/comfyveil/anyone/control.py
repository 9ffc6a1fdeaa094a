"""A small asyncio client for anon's control port (Tor's control protocol).

Only what comfyveil needs: cookie/SAFECOOKIE authentication, GETINFO, SETEVENTS,
ADD_ONION / DEL_ONION, ONION_CLIENT_AUTH_ADD / REMOVE and SIGNAL. Replies are read
by one task; asynchronous events (code 650) go to subscriber queues, everything
else answers the oldest pending command.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from comfyveil import tasks as background
from comfyveil.anyone import errors

logger = logging.getLogger(__name__)

SERVER_TO_CONTROLLER = b"Tor safe cookie authentication server-to-controller hash"
CONTROLLER_TO_SERVER = b"Tor safe cookie authentication controller-to-server hash"
COMMAND_TIMEOUT = 30.0


@dataclass(frozen=True)
class ReplyLine:
    status: int
    text: str
    data: str | None = None  # the body of a "250+key=" data reply


@dataclass(frozen=True)
class Reply:
    lines: tuple[ReplyLine, ...]

    @property
    def status(self) -> int:
        return self.lines[-1].status

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def values(self) -> dict[str, str]:
        """key=value pairs of the reply lines (data replies give their body)."""
        out: dict[str, str] = {}
        for line in self.lines:
            key, sep, value = line.text.partition("=")
            if sep:
                out[key] = line.data if line.data is not None else value
        return out


@dataclass(frozen=True)
class Event:
    kind: str  # "HS_DESC", "STATUS_CLIENT", ...
    text: str  # the whole first line, after the code


@dataclass(frozen=True)
class OnionService:
    service_id: str  # 56 characters, no suffix
    private_key: str | None = field(default=None, repr=False)  # "ED25519-V3:..." unless discarded


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ControlConnection:
    """One authenticated control connection; use `connect()`, then `close()`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._pending: asyncio.Queue[asyncio.Future[Reply]] = asyncio.Queue()
        self._lock = asyncio.Lock()
        self._subscribers: list[tuple[frozenset[str], asyncio.Queue[Event]]] = []
        self._events: set[str] = set()
        self._closed = asyncio.Event()
        self._reader_task = asyncio.create_task(self._read_loop(), name="anon-control-reader")

    @classmethod
    async def connect(
        cls, host: str, port: int, *, cookie_file: Path | None = None, within: float = 10.0
    ) -> ControlConnection:
        """A control port on TCP (an operator's daemon)."""
        try:
            reader, writer = await background.wait_for(asyncio.open_connection(host, port), within)
        except (OSError, TimeoutError) as exc:
            raise errors.ControlError(
                f"cannot reach anon's control port at {host}:{port}"
            ) from exc
        return await cls._authenticated(reader, writer, cookie_file)

    @classmethod
    async def connect_unix(
        cls, path: Path, *, cookie_file: Path | None = None, within: float = 10.0
    ) -> ControlConnection:
        """A control port on a Unix socket (our own anon)."""
        try:
            reader, writer = await background.wait_for(
                asyncio.open_unix_connection(str(path)), within)
        except (OSError, TimeoutError) as exc:
            raise errors.ControlError(f"cannot reach anon's control socket {path}") from exc
        return await cls._authenticated(reader, writer, cookie_file)

    @classmethod
    async def _authenticated(
        cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        cookie_file: Path | None,
    ) -> ControlConnection:
        conn = cls(reader, writer)
        try:
            await conn.authenticate(cookie_file)
        except BaseException:
            await conn.close()
            raise
        return conn

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        await background.cancel_and_wait([self._reader_task])
        self._closed.set()

    # -- protocol plumbing -------------------------------------------------------------

    async def _read_line(self) -> str:
        raw = await self._reader.readline()
        if not raw:
            raise ConnectionError("control connection closed")
        return raw.decode("utf-8", errors="replace").rstrip("\r\n")

    async def _read_reply(self) -> Reply:
        lines: list[ReplyLine] = []
        while True:
            line = await self._read_line()
            if len(line) < 4 or not line[:3].isdigit():
                raise ConnectionError(f"malformed control reply line: {line[:40]!r}")
            status, sep, text = int(line[:3]), line[3], line[4:]
            data = None
            if sep == "+":
                body: list[str] = []
                while (chunk := await self._read_line()) != ".":
                    body.append(chunk[1:] if chunk.startswith("..") else chunk)
                data = "\n".join(body)
            lines.append(ReplyLine(status, text, data))
            if sep == " ":
                return Reply(tuple(lines))

    async def _read_loop(self) -> None:
        try:
            while True:
                reply = await self._read_reply()
                if reply.status == 650:
                    self._dispatch(reply)
                    continue
                future = self._pending.get_nowait() if not self._pending.empty() else None
                if future is not None and not future.done():
                    future.set_result(reply)
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            logger.debug("control connection ended: %s", exc)
        finally:
            self._closed.set()
            while not self._pending.empty():
                future = self._pending.get_nowait()
                if not future.done():
                    future.set_exception(errors.ControlError("anon's control connection closed"))

    def _dispatch(self, reply: Reply) -> None:
        first = reply.lines[0].text
        event = Event(first.split(" ", 1)[0], first)
        for kinds, queue in self._subscribers:
            if event.kind in kinds:
                queue.put_nowait(event)

    async def request(self, command: str, *, check: bool = True) -> Reply:
        """Send one command line and return its reply; refuse a reply that is an error."""
        if self._closed.is_set():
            raise errors.ControlError("anon's control connection is closed")
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        async with self._lock:
            self._pending.put_nowait(future)
            self._writer.write(command.encode() + b"\r\n")
            await self._writer.drain()
        try:
            reply = await background.wait_for(future, COMMAND_TIMEOUT)
        except TimeoutError as exc:
            raise errors.ControlError("anon's control port did not answer in time") from exc
        if check and not reply.ok:
            verb = command.split(" ", 1)[0]
            raise errors.ControlError(f"anon refused {verb}: {reply.lines[-1].text}")
        return reply

    # -- authentication ----------------------------------------------------------------

    async def authenticate(self, cookie_file: Path | None = None) -> None:
        info = await self.request("PROTOCOLINFO 1")
        auth_line = next((ln.text for ln in info.lines if ln.text.startswith("AUTH ")), "")
        methods = set(re.search(r"METHODS=(\S+)", auth_line).group(1).split(",")) if (
            "METHODS=" in auth_line) else set()
        if "NULL" in methods:
            await self.request("AUTHENTICATE")
            return
        if cookie_file is None:
            match = re.search(r'COOKIEFILE="((?:[^"\\]|\\.)*)"', auth_line)
            if match is None:
                raise errors.ControlError("anon's control port offers no cookie authentication")
            cookie_file = Path(match.group(1).replace('\\"', '"').replace("\\\\", "\\"))
        try:
            cookie = await asyncio.to_thread(cookie_file.read_bytes)
        except OSError as exc:
            raise errors.ControlError(f"cannot read anon's cookie file {cookie_file}") from exc
        if "SAFECOOKIE" in methods:
            client_nonce = secrets.token_bytes(32)
            reply = await self.request(f"AUTHCHALLENGE SAFECOOKIE {client_nonce.hex()}")
            text = reply.lines[-1].text
            server_hash = bytes.fromhex(re.search(r"SERVERHASH=(\w+)", text).group(1))
            server_nonce = bytes.fromhex(re.search(r"SERVERNONCE=(\w+)", text).group(1))
            message = cookie + client_nonce + server_nonce
            expected = hmac.new(SERVER_TO_CONTROLLER, message, hashlib.sha256).digest()
            if not hmac.compare_digest(expected, server_hash):
                raise errors.ControlError("anon's control port failed the SAFECOOKIE check")
            answer = hmac.new(CONTROLLER_TO_SERVER, message, hashlib.sha256).hexdigest()
            await self.request(f"AUTHENTICATE {answer}")
        elif "COOKIE" in methods:
            await self.request(f"AUTHENTICATE {cookie.hex()}")
        else:
            raise errors.ControlError("anon's control port offers no authentication we support")

    # -- commands ----------------------------------------------------------------------

    async def getinfo(self, *keys: str) -> dict[str, str]:
        reply = await self.request("GETINFO " + " ".join(keys))
        return reply.values()

    async def signal(self, name: str) -> None:
        await self.request(f"SIGNAL {name}")

    async def set_events(self, kinds: Iterable[str]) -> None:
        self._events = set(kinds)
        await self.request("SETEVENTS " + " ".join(sorted(self._events)))

    def subscribe(self, *kinds: str) -> asyncio.Queue[Event]:
        """A queue that receives the events of these kinds (also call set_events)."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._subscribers.append((frozenset(kinds), queue))
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        self._subscribers = [(k, q) for k, q in self._subscribers if q is not queue]

    async def add_onion(
        self,
        ports: Mapping[int, str],
        *,
        key: str = "NEW:ED25519-V3",
        client_auth_v3: Iterable[str] = (),
        discard_key: bool = False,
        detach: bool = False,
    ) -> OnionService:
        """Publish an ephemeral hidden service; ports maps virtual port -> "host:port"."""
        flags = []
        auth = list(client_auth_v3)
        if discard_key:
            flags.append("DiscardPK")
        if detach:
            flags.append("Detach")
        if auth:
            flags.append("V3Auth")
        parts = ["ADD_ONION", key]
        if flags:
            parts.append("Flags=" + ",".join(flags))
        parts += [f"Port={virtual},{target}" for virtual, target in ports.items()]
        parts += [f"ClientAuthV3={pub}" for pub in auth]
        values = (await self.request(" ".join(parts))).values()
        if "ServiceID" not in values:
            raise errors.HiddenServiceError("anon did not return the new service's address")
        return OnionService(values["ServiceID"], values.get("PrivateKey"))

    async def del_onion(self, service_id: str) -> None:
        await self.request(f"DEL_ONION {service_id}")

    async def onion_client_auth_add(
        self, service_id: str, private_key: bytes, *, nickname: str | None = None
    ) -> None:
        key = base64.b64encode(private_key).decode()
        command = f"ONION_CLIENT_AUTH_ADD {service_id} x25519:{key}"
        if nickname:
            command += f" ClientName={_quote(nickname)}"
        await self.request(command)

    async def onion_client_auth_remove(self, service_id: str) -> None:
        await self.request(f"ONION_CLIENT_AUTH_REMOVE {service_id}")
