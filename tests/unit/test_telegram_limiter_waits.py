"""The chat rate limiter waits out what Telegram asks after a 429, for every request."""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest
from telegram.error import RetryAfter

from comfyveil.telegram import limits


async def test_after_a_429_everything_waits_as_long_as_telegram_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # as the bot sets it (telegram/app.py)
    limiter = limits.ChatRateLimiter()
    calls: list[tuple[str, float]] = []
    refused = False

    async def edit(name: str) -> bool:
        nonlocal refused
        calls.append((name, time.monotonic()))
        if not refused:
            refused = True
            raise RetryAfter(datetime.timedelta(seconds=1))
        return True

    async def request(name: str) -> object:
        return await limiter.process_request(
            edit, (name,), {}, "editMessageText", {"chat_id": 5, "message_id": 1}, None
        )

    first = asyncio.create_task(request("first"))
    await asyncio.sleep(0.05)  # the 429 has come back
    second = asyncio.create_task(request("second"))
    assert await first is True and await second is True
    refused_at = calls[0][1]
    later = [at for _name, at in calls[1:]]
    # Both the retry and the request that came after the 429 waited the second out.
    assert len(later) == 2 and min(later) - refused_at >= 0.95, calls
