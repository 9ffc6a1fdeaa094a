"""A tiny SOCKS5 relay (RFC 1928, username/password of RFC 1929) that stands in for
anon's SOCKS port: it records the host name and port each client asks for, and
connects every request to that port on 127.0.0.1, whatever the name (so a name that
no resolver knows, like ``hub.test``, works only through it)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import struct
from dataclasses import dataclass, field


@dataclass
class SocksRelay:
    targets: list[tuple[str, int]] = field(default_factory=list)  # (host as asked, port)
    users: list[str] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> SocksRelay:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        version, count = await reader.readexactly(2)
        methods = await reader.readexactly(count)
        if version != 5:
            return
        if 2 in methods:
            writer.write(b"\x05\x02")
            await writer.drain()
            _v, ulen = await reader.readexactly(2)
            user = (await reader.readexactly(ulen)).decode()
            (plen,) = await reader.readexactly(1)
            await reader.readexactly(plen)
            self.users.append(user)
            writer.write(b"\x01\x00")
        elif 0 in methods:
            writer.write(b"\x05\x00")
        else:
            writer.write(b"\x05\xff")
            return
        await writer.drain()
        _v, command, _r, kind = await reader.readexactly(4)
        if kind == 3:
            (length,) = await reader.readexactly(1)
            host = (await reader.readexactly(length)).decode()
        elif kind == 1:
            host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
        else:
            host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
        (port,) = struct.unpack("!H", await reader.readexactly(2))
        self.targets.append((host, port))
        if command != 1:
            writer.write(b"\x05\x07\x00\x01" + bytes(6))
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.write(b"\x05\x05\x00\x01" + bytes(6))
            return
        writer.write(b"\x05\x00\x00\x01" + bytes(4) + struct.pack("!H", port))
        await writer.drain()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(256 * 1024):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
