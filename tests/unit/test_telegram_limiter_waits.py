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


def test_a_private_gap_learned_short_widens_when_a_message_sent_after_it_is_refused() -> None:
    """Telegram counts arrivals; the limiter counts departures. When the earlier message
    arrived late (a loaded host), a 429's bound comes out under the real gap, here 1.9 s
    against 2 s. A message refused after waiting the whole learned gap proves it short:
    before, the least bound was kept and every later message was refused once."""
    now = 100.0
    limiter = limits.ChatRateLimiter(clock=lambda: now)
    chat = 7000
    limiter._taken(chat, 100.0, False)
    # sent 0.9 s after the last by our clock; Telegram saw 1.05 s and asked for 1 s more
    limiter._learn(chat, 100.9, 1.0, deletion=False)
    short = limiter.private_gap
    assert 1.9 <= short < 2.0  # 1.9 s and its 5 % margin: short of Telegram's 2 s
    now = 103.0
    limiter._taken(chat, 103.0, False)
    now = 103.0 + short
    limiter._learn(chat, now, 1.0, deletion=False)  # refused after the learned gap
    assert limiter.private_gap > short  # not the same refusal again and again
    assert limiter.private_gap < 2.3  # by what the refusal showed, not a ratchet
