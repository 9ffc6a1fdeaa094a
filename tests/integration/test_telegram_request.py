"""The bot's own Bot API HTTP layer (aiohttp) when the Bot API misbehaves."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import telegram
from telegram import error

from comfyveil.telegram.request import AiohttpRequest

TOKEN = "123456:secret-token-never-in-messages"


async def test_a_silent_bot_api_times_out_within_the_read_timeout() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    bot = telegram.Bot(TOKEN, base_url=f"http://127.0.0.1:{port}/bot",
                       request=AiohttpRequest(read_timeout=0.3))
    started = time.monotonic()
    try:
        with pytest.raises(error.TimedOut):
            await bot.initialize()  # getMe
    finally:
        await bot.shutdown()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
    assert accepted, "the request never reached the server"
    assert time.monotonic() - started < 5


async def test_an_unreachable_bot_api_is_a_network_error_without_the_token() -> None:
    # Bound but not listening, and held: refused, and no other process can take the port.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        bot = telegram.Bot(TOKEN, base_url=f"http://127.0.0.1:{port}/bot",
                           request=AiohttpRequest())
        try:
            with pytest.raises(error.NetworkError) as raised:
                await bot.initialize()
        finally:
            await bot.shutdown()
    assert not isinstance(raised.value, error.TimedOut)
    assert "secret" not in str(raised.value)
