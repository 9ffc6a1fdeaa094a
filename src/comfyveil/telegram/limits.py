"""Keeping within Telegram's limits with results first.

Telegram lets a bot send about 30 messages a second, one a second to a private chat
(short bursts tolerated) and 20 a minute to a group, and answers more with 429
(RetryAfter). python-telegram-bot's AIORateLimiter queues every call in one line, so
under load a result waits behind status edits, and a 429 stops everything. This
limiter keeps its own account of the same windows and treats two kinds of traffic
differently:

- Results, replies to commands and final words ("normal"): sent as soon as the windows
  allow, waiting for them if needed; while one waits, no status traffic is let out.
- Status messages and their edits (``rate_limit_args=SHED``): sent only when the windows
  have room to spare (a reserve kept for results) and no result waits; otherwise
  refused at once with :class:`Shed`. The status tracker then keeps the message dirty
  and shows the newest text at its next chance, so edits are coalesced, not queued.

Sends and edits count toward the overall limit, only sends toward a chat's own (edits
change a message the chat has; Telegram's per-chat limits are on messages sent to it).
Deleting messages, answering button presses and reading (getUpdates, getFile) are not
counted, as Telegram does not count them as messages.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from telegram.error import RetryAfter, TelegramError
from telegram.ext import BaseRateLimiter

logger = logging.getLogger(__name__)

SHED = "shed"  # rate_limit_args of status traffic: may be refused
# Our windows are a little narrower than Telegram's: a request is counted here when it
# leaves and there when it arrives, and arrivals bunch up by a few milliseconds.
OVERALL_PER_SECOND = 29
PRIVATE_GAP = 1.1  # seconds per message to one private chat, on average ...
PRIVATE_BURST = 3  # ... after a burst of this many (Telegram tolerates short bursts)
RESERVE_PRIVATE = 1  # of a private chat's burst, kept for its results
GROUP_PER_MINUTE = 19
RESERVE_OVERALL = 4  # of the overall window, kept for results
RESERVE_GROUP = 5  # of a group's minute, kept for results and replies
INFLIGHT_POLL = 0.02  # seconds between looks while the whole window is in flight
MAX_RETRIES = 3  # RetryAfter answers a normal request waits out before giving up


class Shed(TelegramError):
    """A status update was not sent: Telegram's limits are needed for results now."""

    def __init__(self) -> None:
        super().__init__("status update shed to leave room for results")


def _counted(endpoint: str) -> bool:
    name = endpoint.lower()
    return name.startswith(("send", "edit", "copy", "forward")) and name != "sendchataction"


class ChatRateLimiter(BaseRateLimiter[str]):
    """PTB's rate limiter for comfyveil (see the module docstring)."""

    def __init__(
        self,
        *,
        overall: int = OVERALL_PER_SECOND,
        private_gap: float = PRIVATE_GAP,
        group_per_minute: int = GROUP_PER_MINUTE,
        max_retries: int = MAX_RETRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.overall = overall
        self.private_gap = private_gap
        self.group_per_minute = group_per_minute
        self.max_retries = max_retries
        self._clock = clock
        self._sent: collections.deque[float] = collections.deque()  # the last second
        self._chats: dict[int, collections.deque[float]] = {}  # groups' last minute
        self._private: dict[int, tuple[float, float]] = {}  # private chats' (tokens, when)
        self._waiting = 0  # normal requests waiting for room
        self._inflight = 0  # counted requests sent and not answered yet
        self._pause_until = 0.0  # after a RetryAfter without a chat, everything waits
        self.shed = 0  # status requests refused (for tests and benchmarks)
        self.sent = 0
        self.retried = 0

    async def initialize(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    # --- the windows --------------------------------------------------------------

    def _wait(self, chat_id: int | None, now: float, *, spare: bool) -> float:
        """Seconds until a message fits (0: now); `chat_id`: a send to that chat (None: an
        edit, or no chat); `spare`: leave the reserves."""
        sent = self._sent
        while sent and sent[0] <= now - 1.0:
            sent.popleft()
        limit = self.overall - (RESERVE_OVERALL if spare else 0)
        waits = [self._pause_until - now]
        # Telegram counts a request when it arrives, which is after it left and before its
        # answer came back: requests in flight count, and done ones until a second after
        # their answer, so no window of arrivals can hold more than `limit`.
        if self._inflight >= limit:
            waits.append(INFLIGHT_POLL)
        elif len(sent) + self._inflight >= limit:
            waits.append(sent[len(sent) + self._inflight - limit] + 1.0 - now)
        if chat_id is not None and chat_id > 0:  # private (users' ids > 0, groups' < 0)
            need = 1.0 + (RESERVE_PRIVATE if spare else 0)
            tokens = self._tokens(chat_id, now)
            if tokens < need:
                waits.append((need - tokens) * self.private_gap)
        elif chat_id is not None and (window := self._chats.get(chat_id)):
            while window and window[0] <= now - 60.0:
                window.popleft()
            group_limit = self.group_per_minute - (RESERVE_GROUP if spare else 0)
            if len(window) >= group_limit:
                waits.append(window[len(window) - group_limit] + 60.0 - now)
        return max(0.0, *waits)

    def _tokens(self, chat_id: int, now: float) -> float:
        held, at = self._private.get(chat_id, (float(PRIVATE_BURST), now))
        return min(float(PRIVATE_BURST), held + (now - at) / self.private_gap)

    async def _send(
        self,
        chat_id: int | None,
        callback: Callable[..., Coroutine[Any, Any, Any]],
        args: Any,
        kwargs: dict[str, Any],
    ) -> Any:
        self._record(chat_id, self._clock())
        self._inflight += 1
        try:
            return await callback(*args, **kwargs)
        finally:
            self._inflight -= 1
            self._sent.append(self._clock())  # answered: counts for a second from now

    def _record(self, chat_id: int | None, now: float) -> None:
        self.sent += 1
        if chat_id is not None and chat_id > 0:
            self._private[chat_id] = (self._tokens(chat_id, now) - 1.0, now)
        elif chat_id is not None:
            self._chats.setdefault(chat_id, collections.deque()).append(now)
        if len(self._private) + len(self._chats) > 50_000:  # forget chats quiet for a minute
            cutoff = now - 60.0
            for key in [k for k, w in self._chats.items() if not w or w[-1] < cutoff]:
                del self._chats[key]
            for key in [k for k, (_, at) in self._private.items() if at < cutoff]:
                del self._private[key]

    def has_room(self) -> bool:
        """Whether a status edit would go out now (no result waits, room to spare)."""
        return not self._waiting and self._wait(None, self._clock(), spare=True) == 0

    # --- PTB's entry point --------------------------------------------------------

    async def process_request(
        self,
        callback: Callable[..., Coroutine[Any, Any, bool | dict[str, Any] | list[dict[str, Any]]]],
        args: Any,
        kwargs: dict[str, Any],
        endpoint: str,
        data: dict[str, Any],
        rate_limit_args: str | None,
    ) -> bool | dict[str, Any] | list[dict[str, Any]]:
        if not _counted(endpoint):
            return await callback(*args, **kwargs)
        chat_id: int | None = None
        if not endpoint.lower().startswith("edit"):  # edits count toward the overall only
            try:
                chat_id = int(data["chat_id"])
            except (KeyError, TypeError, ValueError):
                chat_id = None
        if rate_limit_args == SHED:
            now = self._clock()
            if self._waiting or self._wait(chat_id, now, spare=True) > 0:
                self.shed += 1
                raise Shed()
            return await self._send(chat_id, callback, args, kwargs)
        for attempt in range(self.max_retries + 1):
            self._waiting += 1
            try:
                # The windows only free up with time: sleep until this one has room.
                wait = self._wait(chat_id, self._clock(), spare=False)
                while wait > 0:
                    await asyncio.sleep(wait)
                    wait = self._wait(chat_id, self._clock(), spare=False)
            finally:
                self._waiting -= 1
            try:
                return await self._send(chat_id, callback, args, kwargs)
            except RetryAfter as exc:
                if attempt == self.max_retries:
                    raise
                self.retried += 1
                delay = _seconds(exc)
                logger.info(
                    "Telegram asked to wait %.0f s", delay, extra={"action": "telegram_retry_after"}
                )
                if chat_id is None:
                    self._pause_until = self._clock() + delay
                else:  # that chat's window is fuller than we counted: wait it out
                    await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


def _seconds(exc: RetryAfter) -> float:
    value: Any = exc.retry_after
    return float(value.total_seconds() if hasattr(value, "total_seconds") else value)
