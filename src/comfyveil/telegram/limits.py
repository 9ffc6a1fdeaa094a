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

Telegram publishes none of these numbers and changes them, so the model learns from the
429s it gets (:meth:`ChatRateLimiter._learn`):

- A deletion answered 429 means deletions count (from then on they wait, after results,
  for room in the overall window). So does a send refused while the messages it sent in
  the second before were within our model but deletions in that second took it past:
  nothing is known of the overall rate yet from either.
- A send refused soon after the chat's last message (within 1.5 of its gaps, or 2 s) is
  the chat's own limit. Its gap is at most the time from when that message left to
  the 429's answer, plus ``retry_after``: a bound that holds however long either was on
  the way (a round trip counted up to 2 s, so that a stall teaches no gap as long as
  itself). The least such bound seen is kept (``retry_after`` is whole seconds, so any
  one bound may be a second too long, and a gap that only grew would ratchet), except
  that a message refused after waiting the whole learned gap raises it to 5 % past what
  that message waited.
  A refusal inside the chat's burst means no burst. Each chat's gap runs from the
  answer to its last message, not from when that left, since Telegram counts arrivals.
- Any other 429 is the overall limit, which becomes the messages the server accepted in
  the second before (counted once the earlier requests are answered), and one less than
  ours when that is no fewer. A learned limit refused again comes down by one: under
  load the answers come late and unevenly, arrivals bunch up, and the second before
  undercounts (once 5 against a server allowing 10).
- Results wait for their own chat's window each on its own timer, then take turns at
  the overall one; status traffic stays out for a second after a result waited there.

A 429 for a request sent before the last lesson of its kind teaches nothing: it was sent
under the old model. The model only narrows.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
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
MAX_PRIVATE_GAP = 60.0  # the most a learned private chat's gap may grow to, in seconds
WIDENING = 1.05  # a private gap proved short grows past what the refused message waited
# The most a 429's round trip counts toward a private chat's gap bound, in seconds: a
# message refused after a stall (a circuit rebuilt, a host paused) would otherwise teach
# a gap as long as the stall, and the chats would send that slowly with no later 429 to
# correct it. A path slower than this one way is what the widening corrects.
MAX_ON_THE_WAY = 2.0
# A send refused within this many gaps (or seconds, the more) of the chat's last accepted
# message is put down to the chat's own limit; one to a chat quiet longer, to the overall.
CHAT_SUSPECT = 1.5
CHAT_SUSPECT_SECONDS = 2.0
MIN_EVIDENCE = 3  # messages taken in the second before a 429, for it to teach the overall
ACCEPTED_MEMORY = 10.0  # seconds accepted messages are remembered, to learn from a 429


class Shed(TelegramError):
    """A status update was not sent: Telegram's limits are needed for results now."""

    def __init__(self) -> None:
        super().__init__("status update shed to leave room for results")


def _counted(endpoint: str) -> bool:
    name = endpoint.lower()
    return name.startswith(("send", "edit", "copy", "forward")) and name != "sendchataction"


def _deletion(endpoint: str) -> bool:
    return endpoint.lower().startswith("delete") and endpoint.lower() != "deletewebhook"


class ChatRateLimiter(BaseRateLimiter[str]):
    """PTB's rate limiter for comfyveil (see the module docstring)."""

    def __init__(
        self,
        *,
        overall: int = OVERALL_PER_SECOND,
        private_gap: float = PRIVATE_GAP,
        private_burst: int = PRIVATE_BURST,
        group_per_minute: int = GROUP_PER_MINUTE,
        max_retries: int = MAX_RETRIES,
        count_deletions: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The model of Telegram's limits; `_learn` narrows it on each 429.
        self.overall = overall
        self.private_gap = private_gap
        self.private_burst = private_burst
        self.group_per_minute = group_per_minute
        self.count_deletions = count_deletions
        self.max_retries = max_retries
        self._clock = clock
        self._sent: collections.deque[float] = collections.deque()  # the last second
        self._chats: dict[int, collections.deque[float]] = {}  # groups' last minute
        self._private: dict[int, tuple[float, float]] = {}  # private chats' (tokens, when)
        self._waiting = 0  # normal requests waiting for room
        self._inflight = 0  # counted requests sent and not answered yet
        self._pause_until = 0.0  # after an overall 429, everything waits
        # What the server took: send times of accepted messages (the last seconds) and
        # each chat's last accepted one.
        self._accepted: collections.deque[tuple[float, bool]] = collections.deque()
        self._leaving: dict[int, tuple[float, bool]] = {}  # in flight: (sent at, deletion)
        self._keys = itertools.count()
        self._last_taken: dict[int, float] = {}
        # 429s to learn from: when each left.
        self._pending: collections.deque[float] = collections.deque()
        self._overall_learned = self._private_learned = -1e9  # when the last lessons were
        self._private_gap_bound = math.inf  # the least bound a 429 put on the gap
        self._initial_private_gap = private_gap
        self._initial_overall = overall
        # After a result waited for the overall window, status traffic stays out for a
        # second: a status edit let into the first gap would take the next result's place.
        self._status_quiet_until = 0.0
        self._overall_turn = asyncio.Lock()  # normal requests take turns at the overall window
        self.shed = 0  # status requests refused (for tests and benchmarks)
        self.sent = 0
        self.retried = 0
        self.lessons: list[str] = []  # what the 429s taught, in order (logs, benchmarks)

    async def initialize(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    # --- the windows --------------------------------------------------------------

    def _wait(self, chat_id: int | None, now: float, *, spare: bool) -> float:
        """Seconds until a message fits (0: now); `chat_id`: a send to that chat (None: an
        edit, or no chat); `spare`: leave the reserves."""
        return max(self._overall_wait(now, spare=spare), self._chat_wait(chat_id, now, spare=spare))

    def _overall_wait(self, now: float, *, spare: bool) -> float:
        sent = self._sent
        while sent and sent[0] <= now - 1.0:
            sent.popleft()
        # (A model narrowed to a few a second keeps one for status traffic, not none.)
        limit = max(1, self.overall - (RESERVE_OVERALL if spare else 0))
        wait = self._pause_until - now
        # Telegram counts a request when it arrives, which is after it left and before its
        # answer came back: requests in flight count, and done ones until a second after
        # their answer, so no window of arrivals can hold more than `limit`.
        if self._inflight >= limit:
            wait = max(wait, INFLIGHT_POLL)
        elif len(sent) + self._inflight >= limit:
            wait = max(wait, sent[len(sent) + self._inflight - limit] + 1.0 - now)
        return max(0.0, wait)

    def _chat_wait(self, chat_id: int | None, now: float, *, spare: bool) -> float:
        if chat_id is not None and chat_id > 0:  # private (users' ids > 0, groups' < 0)
            # (A burst learned down to one leaves no reserve: status posts still go.)
            reserve = RESERVE_PRIVATE if spare and self.private_burst > RESERVE_PRIVATE else 0
            need = 1.0 + reserve
            tokens = self._tokens(chat_id, now)
            if tokens < need:
                return (need - tokens) * self.private_gap
        elif chat_id is not None and (window := self._chats.get(chat_id)):
            while window and window[0] <= now - 60.0:
                window.popleft()
            group_limit = self.group_per_minute - (RESERVE_GROUP if spare else 0)
            if len(window) >= group_limit:
                return max(0.0, window[len(window) - group_limit] + 60.0 - now)
        return 0.0

    def _tokens(self, chat_id: int, now: float) -> float:
        burst = float(self.private_burst)
        held, at = self._private.get(chat_id, (burst, now))
        return min(burst, held + (now - at) / self.private_gap)

    async def _send(
        self,
        chat_id: int | None,
        callback: Callable[..., Coroutine[Any, Any, Any]],
        args: Any,
        kwargs: dict[str, Any],
        *,
        deletion: bool = False,
        counted: bool = True,
    ) -> Any:
        """Send one request; an uncounted one (a deletion while deletions are thought
        free) only has its answer watched, to learn when that is wrong."""
        now = self._clock()
        if counted:
            self._record(chat_id, now)
            self._inflight += 1
        key = next(self._keys)
        self._leaving[key] = (now, deletion)
        try:
            result = await callback(*args, **kwargs)
        except RetryAfter as exc:
            self._learn(chat_id, now, retry_after_seconds(exc), deletion=deletion)
            raise
        else:
            self._taken(chat_id, now, deletion)
            if counted and chat_id is not None and chat_id > 0:
                self._gap_from_answer(chat_id, now)
            return result
        finally:
            del self._leaving[key]
            if counted:
                self._inflight -= 1
                self._sent.append(self._clock())  # answered: counts for a second from now
            self._settle()

    def _gap_from_answer(self, chat_id: int, sent_at: float) -> None:
        """Restart the refill of a private chat's bucket at the answer to the message sent
        at `sent_at`, unless a later message was recorded since: Telegram counted the
        message when it arrived, some time before the answer, and the next one must not
        arrive within a gap of it however long this one took on the way."""
        held, at = self._private.get(chat_id, (0.0, sent_at))
        if at == sent_at:
            self._private[chat_id] = (held, self._clock())

    # --- learning from Telegram's answers -----------------------------------------

    def _window(self, at: float, *, deletions: bool) -> int:
        """Messages the server accepted that left in the second before `at`."""
        start = at - 1.0
        return sum(1 for t, d in self._accepted if start < t < at and (deletions or not d))

    def _taken(self, chat_id: int | None, sent_at: float, deletion: bool) -> None:
        accepted = self._accepted
        accepted.append((sent_at, deletion))
        while accepted and accepted[0][0] <= self._clock() - ACCEPTED_MEMORY:
            accepted.popleft()
        if chat_id is not None and not deletion:
            self._last_taken[chat_id] = sent_at

    def _learn(
        self, chat_id: int | None, sent_at: float, delay: float, *, deletion: bool
    ) -> None:
        """Narrow the model after a 429 for a request sent at `sent_at` (see the module
        docstring for the reasoning)."""
        now = self._clock()
        news = deletion and not self.count_deletions
        if news:
            self.count_deletions = True
            self._lesson("deletions count toward the overall limit")
        last = self._last_taken.get(chat_id) if chat_id is not None else None
        if chat_id is not None and chat_id > 0 and not deletion and last is not None:
            if sent_at - last < max(CHAT_SUSPECT * self.private_gap, CHAT_SUSPECT_SECONDS):
                self._learn_private(chat_id, sent_at, last, delay, now)
                return
        elif chat_id is not None and not deletion and last is not None:
            window = self._chats.get(chat_id)
            recent = sum(1 for t in window or () if t > sent_at - 60.0)
            if window is not None and recent >= self.group_per_minute // 2:
                if recent - 1 < self.group_per_minute:
                    self.group_per_minute = max(1, recent - 1)
                    self._lesson(f"a group takes {self.group_per_minute} messages a minute")
                window.append(now + delay)  # its next message waits at least `delay`
                return
        # An edit, a deletion, or a chat that had been quiet: the overall limit. Everything
        # waits as long as Telegram asked; how many it took in the second before is known
        # once the requests that left before this one are answered (`_settle`).
        self._pause_until = max(self._pause_until, now + delay)
        if news:
            # Our model let these deletions through uncounted: the 429 says they count,
            # not that the overall rate is lower; what was sent under the old model
            # teaches nothing more.
            self._overall_learned = now
            return
        self._pending.append(sent_at)
        self._settle()

    def _settle(self) -> None:
        """Learn the overall limit from the 429s whose earlier requests are answered."""
        while self._pending:
            sent_at = self._pending[0]
            if any(t < sent_at for t, _ in self._leaving.values()):
                return
            self._pending.popleft()
            if sent_at < self._overall_learned:
                # Sent under the old model: its 429 says nothing the last lesson did not
                # (a burst answered 429 at once is one).
                continue
            # The server had taken its limit when this one arrived: `taken`, the ones it
            # accepted that left in the second before. Our windows count a message until
            # a second after its answer, later than the server does, so that many is kept
            # to; a 429 at our own limit or above means one less.
            taken = self._window(sent_at, deletions=self.count_deletions)
            if not self.count_deletions:
                with_deletions = self._window(sent_at, deletions=True)
                if with_deletions > taken and with_deletions >= MIN_EVIDENCE:
                    # Deletions we let through uncounted shared that second: they count
                    # (the cheaper explanation; a lower rate shows in the next 429).
                    self.count_deletions = True
                    self._overall_learned = self._clock()
                    self._lesson("deletions count toward the overall limit")
                    continue
            if taken < MIN_EVIDENCE:
                continue  # not the overall window (a method's own flood control): wait only
            overall = max(1, min(taken, self.overall - 1))
            if self.overall < self._initial_overall:
                # A model learned before, refused now, was a little too high: one less.
                # The counts say less under load (answers come late and unevenly, and
                # arrivals bunch up): a second lesson taken from them once came out at 5
                # against a server allowing 10, half the rate for the rest of the run.
                overall = max(1, self.overall - 1)
            if overall < self.overall:
                self._overall_learned = self._clock()
                self.overall = overall
                self._lesson(f"{self.overall} messages a second overall")

    def _learn_private(
        self, chat_id: int, sent_at: float, last: float, delay: float, now: float
    ) -> None:
        # Telegram let the last message in when it arrived, after it left (`last`), and
        # refused this one when it arrived, before its answer came back (`now`), to be
        # taken `delay` s later (whole seconds, rounded up): the gap is at most
        # `now - last + delay`, however long either spent on the way (up to
        # MAX_ON_THE_WAY). The least such bound is the estimate; never below the model we
        # started from. Counted from when this one left instead, the bound came out short
        # by its time on the way (1.1 s against 2 s with arrivals jittered by up to
        # 2.5 s), and a short least bound is never corrected by a later, longer one. A
        # bound that holds needs no margin: each chat's gap runs from the answer to its
        # last message, which came after Telegram counted it, so no two arrivals come
        # closer than the gap. A later message answered first bounds nothing about this.
        since_last = sent_at - last
        if last <= sent_at:
            on_the_way = min(now - sent_at, MAX_ON_THE_WAY)
            bound = since_last + on_the_way + delay
            self._private_gap_bound = min(self._private_gap_bound, bound)
        if last >= self._private_learned and since_last > self.private_gap - 0.01:
            # Refused after waiting the whole learned gap: the gap is longer than that (a
            # server that rounds its `retry_after` down, or counts otherwise), by how much
            # is not said, and a gap kept at the least bound would have every later
            # message refused once.
            self._private_gap_bound = max(self._private_gap_bound, since_last * WIDENING)
        gap = self.private_gap
        if math.isfinite(self._private_gap_bound):
            gap = min(MAX_PRIVATE_GAP, max(self._initial_private_gap, self._private_gap_bound))
        inside_burst = since_last < self.private_gap
        burst = 1 if inside_burst else max(1, self.private_burst - 1)
        # Only a refusal of messages sent under the current model says it is wrong.
        fresh = last >= self._private_learned
        if abs(gap - self.private_gap) > 0.05 or (fresh and burst < self.private_burst):
            self._private_learned = now
            self.private_gap = gap
            if fresh and burst < self.private_burst:
                self._lower_burst(burst)
            self._lesson(
                f"a private chat takes one message every {gap:.1f} s "
                f"after a burst of {self.private_burst}"
            )
        # Empty its bucket so that it fills again when Telegram said it would.
        self._private[chat_id] = (1.0 - delay / self.private_gap, now)

    def _lower_burst(self, burst: int) -> None:
        """A smaller burst: every chat keeps what it has used of the old one, so a chat
        in the middle of its burst does not start a new one."""
        used_up = self.private_burst - burst
        self.private_burst = burst
        for chat_id, (held, at) in self._private.items():
            self._private[chat_id] = (held - used_up, at)

    def _lesson(self, what: str) -> None:
        self.lessons.append(what)
        logger.info("Telegram's limits: %s", what, extra={"action": "telegram_limits_learned"})

    def _record(self, chat_id: int | None, now: float) -> None:
        self.sent += 1
        if chat_id is not None and chat_id > 0:
            self._private[chat_id] = (self._tokens(chat_id, now) - 1.0, now)
        elif chat_id is not None:
            self._chats.setdefault(chat_id, collections.deque()).append(now)
        if (
            len(self._private) + len(self._chats) + len(self._last_taken) > 50_000
        ):  # forget chats quiet for a minute
            cutoff = now - 60.0
            for key in [k for k, w in self._chats.items() if not w or w[-1] < cutoff]:
                del self._chats[key]
            for key in [k for k, (_, at) in self._private.items() if at < cutoff]:
                del self._private[key]
            for key in [k for k, at in self._last_taken.items() if at < cutoff]:
                del self._last_taken[key]

    def has_room(self) -> bool:
        """Whether a status edit would go out now (no result waits, room to spare)."""
        now = self._clock()
        return self._status_may_go(now) and self._wait(None, now, spare=True) == 0

    def _status_may_go(self, now: float) -> bool:
        return not self._waiting and now >= self._status_quiet_until

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
        if _deletion(endpoint):
            return await self._delete(callback, args, kwargs)
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
            if not self._status_may_go(now) or self._wait(chat_id, now, spare=True) > 0:
                self.shed += 1
                raise Shed()
            return await self._send(chat_id, callback, args, kwargs)
        for attempt in range(self.max_retries + 1):
            self._waiting += 1
            try:
                # The windows only free up with time: first its own chat's, each request
                # on its own timer; then the overall one, a request at a time in arrival
                # order (hundreds waking together for each free place would cost the
                # event loop more than the sending, and slow every answer).
                while True:
                    wait = self._chat_wait(chat_id, self._clock(), spare=False)
                    while wait > 0:
                        await asyncio.sleep(wait)
                        wait = self._chat_wait(chat_id, self._clock(), spare=False)
                    async with self._overall_turn:
                        wait = self._overall_wait(self._clock(), spare=False)
                        while wait > 0:
                            self._status_quiet_until = self._clock() + 1.0
                            await asyncio.sleep(wait)
                            wait = self._overall_wait(self._clock(), spare=False)
                        # Its chat may have taken a message meanwhile (a status post):
                        # then it waits for its chat again, and the turn goes on.
                        if self._chat_wait(chat_id, self._clock(), spare=False) == 0:
                            break
            finally:
                self._waiting -= 1
            try:
                # (`_send` counts it before its first await: the next in turn sees it.)
                return await self._send(chat_id, callback, args, kwargs)
            except RetryAfter as exc:
                if attempt == self.max_retries:
                    raise
                self.retried += 1
                # `_learn` has paused everything, or emptied the chat's window, for as
                # long as Telegram asked: the next look at the windows waits it out.
                logger.info(
                    "Telegram asked to wait %.0f s",
                    retry_after_seconds(exc),
                    extra={"action": "telegram_retry_after"},
                )
        raise AssertionError("unreachable")  # pragma: no cover

    def _deletion_wait(self) -> float:
        if not self._status_may_go(self._clock()):  # a result waits: it goes first
            return INFLIGHT_POLL
        return self._wait(None, self._clock(), spare=True)

    async def _delete(
        self,
        callback: Callable[..., Coroutine[Any, Any, Any]],
        args: Any,
        kwargs: dict[str, Any],
    ) -> Any:
        """A deletion: sent at once while deletions are thought free; once a 429 said
        they count, it waits until no result does and the window has room to spare."""
        for attempt in range(self.max_retries + 1):
            if self.count_deletions:
                wait = self._deletion_wait()
                while wait > 0:
                    await asyncio.sleep(wait)
                    wait = self._deletion_wait()
            try:
                return await self._send(
                    None, callback, args, kwargs, deletion=True, counted=self.count_deletions
                )
            except RetryAfter:
                if attempt == self.max_retries:
                    raise
                self.retried += 1
        raise AssertionError("unreachable")  # pragma: no cover


def retry_after_seconds(exc: RetryAfter) -> float:
    """How long Telegram asked to wait (an int in older PTB, a timedelta in newer)."""
    value: Any = exc.retry_after
    return float(value.total_seconds() if hasattr(value, "total_seconds") else value)
