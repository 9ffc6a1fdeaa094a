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


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _one_taken_one_refused(
    *, taken: tuple[float, float], refused: tuple[float, float], retry_after: float
) -> limits.ChatRateLimiter:
    """A fresh limiter told of one private chat's message taken and another refused with
    `retry_after`, each as (when it left, when its answer came back)."""
    clock = _Clock(taken[1])
    limiter = limits.ChatRateLimiter(clock=clock)
    limiter._taken(7000, taken[0], False)
    clock.now = refused[1]
    limiter._learn(7000, refused[0], retry_after, deletion=False)
    return limiter


def test_a_private_gap_is_learned_whole_when_a_refused_message_was_long_on_the_way() -> None:
    """Telegram counts a message when it arrives. Two left together (a burst); the second
    sat 1.2 s on the way (a loaded host, a circuit), so Telegram, allowing one every 2 s,
    asked for 1 s more. Counted from when it left, the 429 said the gap was at most 1 s,
    and the gap stayed at 1.1 s: every later message was refused once."""
    # the first answered at once; the second's 429 answered after its arrival at 101.2
    limiter = _one_taken_one_refused(taken=(100.0, 100.01), refused=(100.0, 101.21), retry_after=1)
    assert limiter.private_gap >= 2.0, limiter.lessons
    assert limiter.private_burst == 1


def test_a_429_answered_after_a_stall_teaches_no_gap_as_long_as_the_stall() -> None:
    """A 429 whose answer took 20 s (a circuit rebuilt): counted whole, every private
    chat would send one message every 22 s from then on, and nothing would correct it."""
    limiter = _one_taken_one_refused(taken=(100.0, 100.01), refused=(100.5, 120.5), retry_after=2)
    # 0.5 s since the last, 2 s on the way at most, and the 2 s Telegram asked for
    assert 2.0 <= limiter.private_gap <= 4.5, limiter.lessons


def test_a_429_to_a_message_older_than_the_last_one_taken_teaches_no_gap() -> None:
    """A message that left before the chat's last accepted one and was answered after
    it: nothing bounds the gap between them (the model stays, not 60 s a message)."""
    limiter = _one_taken_one_refused(taken=(100.2, 100.5), refused=(100.0, 100.6), retry_after=2)
    assert limiter.private_gap == limits.PRIVATE_GAP, limiter.lessons


def test_a_private_gap_learned_short_widens_when_a_message_sent_after_it_is_refused() -> None:
    """A server that rounds its `retry_after` down (here 1 s where 1.1 s was meant) has
    the least bound come out under its real gap, here 1.9 s against 2 s. A message
    refused after waiting the whole learned gap proves it short: before, the least bound
    was kept and every later message was refused once."""
    clock = _Clock(100.0)
    limiter = limits.ChatRateLimiter(clock=clock)
    chat = 7000
    limiter._taken(chat, 100.0, False)
    clock.now = 100.9  # refused at once, 0.9 s after the last: "retry after 1"
    limiter._learn(chat, 100.89, 1.0, deletion=False)
    short = limiter.private_gap
    assert 1.85 <= short < 2.0
    clock.now = 103.0
    limiter._taken(chat, 103.0, False)
    clock.now = 103.0 + short + 0.01
    limiter._learn(chat, 103.0 + short, 1.0, deletion=False)  # refused after the learned gap
    assert limiter.private_gap > short  # not the same refusal again and again
    assert limiter.private_gap < 2.3  # by what the refusal showed, not a ratchet
