"""One status message per job, kept up to date in place.

"Queued #3 · about 40 s" -> "Running on gpu0 · 45% · step 9/20"; then the result replaces
it (the sink calls :meth:`StatusTracker.finish`). The message is posted only once the job
has taken `status_delay` seconds (:meth:`StatusTracker.post_later`): a result that comes
sooner arrives alone, with no message flashing up and away before it. Updates arrive by
NOTIFY from the store (a job's events and its progress rows); a slow fallback re-reads
every tracked job now and then in case a notification was missed.

Edits are throttled per message (about one per second in private chats, one per three
seconds in groups, where Telegram allows 20 messages a minute), identical texts are not
sent again, and a ``RetryAfter`` from Telegram (after python-telegram-bot's rate limiter
gave up retrying) pauses that message's edits for as long as Telegram asks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, ReplyParameters
from telegram.constants import ParseMode
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TelegramError

from comfyveil import i18n
from comfyveil import tasks as background
from comfyveil.desk import failures, language
from comfyveil.desk import state as job_state
from comfyveil.i18n import N_, _, ltr
from comfyveil.store import database, eta, jobs
from comfyveil.store import errors as store_errors
from comfyveil.telegram import callbacks_data, limits, render, replies

logger = logging.getLogger(__name__)

PRIVATE_INTERVAL = 1.0  # seconds between two edits of one status message in a private chat
GROUP_INTERVAL = 3.0  # seconds, in groups
FALLBACK_REFRESH = 5.0  # seconds between re-reads of every tracked job without NOTIFY
MAX_CONCURRENT_REFRESH = 16  # status re-renders (database reads + one edit) at once
SHED_PAUSE = 0.5  # seconds before a status update left out for results is tried again
# Seconds between the tries of a status message's last edit the Bot API failed (5xx,
# time-out: about a minute in all); a RetryAfter waits what Telegram asked instead.
FINAL_EDIT_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
FINISHED_MEMORY = 4096  # finished jobs remembered, so a second finish() does nothing
# Telegram allows a bot about 30 messages a second in all; status edits may use a third of
# that, so results and replies always find room however many jobs wait.
EDITS_PER_SECOND = 10.0


def _answering(message_id: int | None) -> ReplyParameters | None:
    """A reply to the message that asked (still sent if its user deleted it meanwhile)."""
    if message_id is None:
        return None
    return ReplyParameters(message_id, allow_sending_without_reply=True)


async def _said_for_sure(call: Callable[[], Awaitable[object]]) -> None:
    """A job's one ending sentence, sent or edited: a 5xx, a time-out or a lost connection
    is tried again, as a rate limit is; a refusal (the message gone, the text already
    there) or the last failure is logged and given up."""
    for delay in (*FINAL_EDIT_RETRY_DELAYS, None):
        try:
            await call()
            return
        except BadRequest as exc:
            logger.debug("status message not changed: %s", exc.message)
            return
        except RetryAfter as exc:
            failure, wait = "RetryAfter", retry_seconds(exc)
        except NetworkError as exc:
            failure, wait = type(exc).__name__, delay or 0.0
        except TelegramError as exc:
            logger.info("status message not finished: %s", type(exc).__name__)
            return
        if delay is None:
            logger.info("status message not finished: %s", failure)
            return
        await asyncio.sleep(wait)


def retry_seconds(exc: RetryAfter) -> float:
    """RetryAfter.retry_after as seconds (a timedelta with PTB_TIMEDELTA, else a number)."""
    value: Any = exc.retry_after
    return float(value.total_seconds() if hasattr(value, "total_seconds") else value)


@dataclass(eq=False)
class _Tracked:
    job_id: uuid.UUID
    chat_id: int
    message_id: int
    in_group: bool
    text: str
    status: jobs.Status = jobs.Status.QUEUED
    rank: tuple[int, int] = (0, 0)  # (attempt, stage) shown: a status never goes backwards
    next_at: float = 0.0  # monotonic time before which no edit is sent
    dirty: bool = False
    busy: bool = False
    closed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class StatusTracker:
    """Keeps the status messages of this bot's jobs current.

    Args:
        bot: the Telegram bot that sent the messages.
        db: the store (job rows and NOTIFY).
        parallel: how many jobs run at once right now.
        backends: the backends that can take jobs now (for queue ETAs; None: unknown).
        offline: whether every GPU is offline now (waiting jobs then say so).
        room: whether Telegram's limits have room for a status edit now.
    """

    def __init__(
        self,
        bot: Bot,
        db: database.Database,
        *,
        parallel: Callable[[], int] = lambda: 1,
        backends: Callable[[], Sequence[str] | None] = lambda: None,
        slots: Mapping[str, int] | None = None,
        offline: Callable[[], bool] = lambda: False,
        is_admin: Callable[[int], bool] = lambda _user: False,
        room: Callable[[], bool] = lambda: True,
        private_interval: float = PRIVATE_INTERVAL,
        group_interval: float = GROUP_INTERVAL,
        fallback_refresh: float = FALLBACK_REFRESH,
        edits_per_second: float = EDITS_PER_SECOND,
    ) -> None:
        self.bot = bot
        self.db = db
        self.parallel = parallel
        self.backends = backends
        self.slots = slots  # how many jobs each backend holds at once (eta.slots_of)
        self.places = eta.PlaceMemory()
        self.etas = eta.EtaMemory()
        self.states = job_state.StateMemory()
        self.offline = offline
        self.is_admin = is_admin
        self.room = room
        self.private_interval = private_interval
        self.group_interval = group_interval
        self.fallback_refresh = fallback_refresh
        self.edits_per_second = edits_per_second
        self._tokens = edits_per_second
        self._tokens_at = time.monotonic()
        self._tracked: dict[uuid.UUID, _Tracked] = {}
        self._finished: collections.OrderedDict[uuid.UUID, None] = collections.OrderedDict()
        # jobs whose end reached `finish`, message or not: a status post due later skips them
        self._ended: collections.OrderedDict[uuid.UUID, None] = collections.OrderedDict()
        # jobs whose ending was said in a reply of its own (`say_ending`): a status message
        # posted after that (a post in flight) is removed, not made a second ending
        self._said: collections.OrderedDict[uuid.UUID, None] = collections.OrderedDict()
        self._wake = asyncio.Event()
        self._sem = asyncio.Semaphore(MAX_CONCURRENT_REFRESH)
        self._tasks: list[asyncio.Task[None]] = []
        self._refreshes: set[asyncio.Task[None]] = set()
        self._pending_posts: set[asyncio.Task[None]] = set()
        self._languages: collections.OrderedDict[uuid.UUID, str] = collections.OrderedDict()
        self.listening = asyncio.Event()
        self.edits = 0  # status edits sent (for tests and the benchmark)
        self.shed = 0  # status edits left out to leave Telegram's limits to results

    # --- life cycle ----------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self.resume()
        except store_errors.StoreError as exc:  # the fallback sweep has nothing to go on
            logger.warning("status messages not resumed: %s", exc,
                           extra={"action": "status_resume_failed"})
        self._tasks = [
            asyncio.create_task(self._listen_loop(), name="status-listen"),
            asyncio.create_task(self._edit_loop(), name="status-edits"),
        ]

    async def stop(self) -> None:
        await background.cancel_and_wait([*self._tasks, *self._refreshes, *self._pending_posts])
        self._tasks = []

    # --- what handlers and the sink call --------------------------------------------

    async def post(
        self, job: jobs.Job, *, reply_to: int | None, in_group: bool,
        asked_by: str | None = None,
    ) -> jobs.Job:
        """Post `job`'s status message now and follow it; the job as stored after (with
        the message that asked for it, `reply_to`, and `asked_by`, for its result).

        Posted from the update that queued the job (or a task it started), so the
        current language is the user's: the job's status speaks it from now on."""
        self._remember_language(job.id, i18n.current())
        text = await self.text_for(job)
        try:
            message = await self.bot.send_message(
                job.chat_id, text, parse_mode=ParseMode.HTML,
                reply_parameters=_answering(reply_to),
                reply_markup=cancel_keyboard(job), rate_limit_args=limits.SHED,
            )
        except limits.Shed:
            # Results need Telegram's limits now: try again shortly, unless it ends first.
            self.post_later(job, delay=SHED_PAUSE, reply_to=reply_to, in_group=in_group,
                            asked_by=asked_by)
            return job
        try:
            job = await self.db.jobs.set_status_message(
                job.id, message.message_id, request_message_id=reply_to, requested_by=asked_by
            )
        except store_errors.StoreError:
            return job  # forgotten meanwhile (/forget), or not recorded: nothing to follow
        if job.status.finished:
            # It finished before its status message was recorded: the sink could not
            # remove it, so do it here.
            await self.finish(job)
        else:
            self.track(job, chat_id=job.chat_id, message_id=message.message_id, text=text,
                       in_group=in_group)
        return job

    def post_later(
        self, job: jobs.Job, *, delay: float, reply_to: int | None, in_group: bool,
        asked_by: str | None = None,
    ) -> None:
        """Post `job`'s status message in `delay` seconds, unless it has finished by then."""
        task = asyncio.create_task(
            self._post_later(job.id, delay=delay, reply_to=reply_to, in_group=in_group,
                             asked_by=asked_by),
            name="status-post",
        )
        self._pending_posts.add(task)
        task.add_done_callback(self._pending_posts.discard)

    async def _post_later(
        self, job_id: uuid.UUID, *, delay: float, reply_to: int | None, in_group: bool,
        asked_by: str | None,
    ) -> None:
        await asyncio.sleep(delay)
        # While results need Telegram's limits the post would be shed: wait for room
        # before spending the database reads that render it (or for the job's end).
        waiting = not self.room()
        while waiting and job_id not in self._ended:  # room is polled: no event tells it
            await asyncio.sleep(SHED_PAUSE)
            waiting = not self.room()
        if job_id in self._ended:
            return  # its result or its ending was delivered here: nothing to ask the database
        try:
            job = await self.db.jobs.get(job_id)
            if job is None or job.status.finished or job.status_message_id is not None:
                return  # its result (or its ending) was sent, or it was forgotten
            await self.post(job, reply_to=reply_to, in_group=in_group, asked_by=asked_by)
        except (store_errors.StoreError, TelegramError) as exc:
            # The result still comes when the job ends; only the progress view is lost.
            logger.info("status message not posted: %s", type(exc).__name__,
                        extra={"action": "status_post_failed", "job_id": str(job_id)})

    def track(
        self, job: jobs.Job, *, chat_id: int, message_id: int, text: str, in_group: bool
    ) -> None:
        """Follow `job`, whose status message `message_id` now shows `text`."""
        if job.status.finished or job.id in self._finished:
            return
        interval = self.group_interval if in_group else self.private_interval
        self._tracked[job.id] = _Tracked(
            job.id, chat_id, message_id, in_group, text, job.status, rank=rank(job),
            next_at=time.monotonic() + interval,
        )

    async def resume(self) -> int:
        """Follow again the status messages of jobs still waiting or running, as after a
        restart: their texts are brought up to date at once. How many were found."""
        found = await self.db.jobs.with_status_message()
        for job in found:
            if job.id in self._tracked or job.status_message_id is None:
                continue
            self.track(job, chat_id=job.chat_id, message_id=job.status_message_id, text="",
                       in_group=job.chat_id < 0)
            self._tracked[job.id].next_at = 0.0
            self._tracked[job.id].dirty = True
        if found:
            self._wake.set()
        return len(found)

    def _remember_language(self, job_id: uuid.UUID, code: str) -> None:
        self._languages[job_id] = code
        while len(self._languages) > FINISHED_MEMORY:
            self._languages.popitem(last=False)

    async def _language(self, job: jobs.Job) -> str:
        """The language `job`'s status speaks: the one it was asked in, else (after a
        restart) its user's."""
        found = self._languages.get(job.id)
        if found is None:
            try:
                found = language.of_settings(await self.db.users.settings(job.user_id))
            except store_errors.StoreError:
                found = i18n.DEFAULT
            self._remember_language(job.id, found)
        return found

    @property
    def tracked(self) -> int:
        return len(self._tracked)

    async def text_for(self, job: jobs.Job) -> str:
        """The status text of `job` as it is now (Telegram HTML)."""
        waiting = job.status is jobs.Status.QUEUED or (
            job.status is jobs.Status.RUNNING and (job.progress or {}).get("state") == "waiting"
        )
        if waiting and self.offline():
            return replies.esc(_(ALL_OFFLINE).format(cancel=ltr("/cancel")))
        # One state for every front end (desk/state.py), shown only forward; the one ETA
        # every front end shows (store/eta.py), the place in the queue only moving forward.
        seen = job_state.of(job)
        if seen.stage is job_state.Stage.QUEUED and seen.note is None:
            wait = await self.db.jobs.wait(job.id, backends=self.backends(), slots=self.slots)
            place = wait.place if wait is not None else None
            seen = self.states.shown(job.id, job_state.of(job, place=place))
            if seen.stage is job_state.Stage.QUEUED:
                view = render.JobView(
                    id=str(job.id), command=job.command, status="queued",
                    position=None if seen.place is None else self.places.place(job.id, seen.place),
                    eta_s=self.etas.seconds(
                        job.id, wait.seconds if wait is not None else None, time.monotonic()
                    ),
                )
                return render.status_text(view)
        else:
            seen = self.states.shown(job.id, seen)
        if seen.stage is job_state.Stage.QUEUED:  # a worker holds it, waiting for a free GPU
            return replies.esc(replies.sentence(seen.note or "").rstrip(".。"))
        if seen.stage is job_state.Stage.WAITING_GPU:
            wait = await self.db.jobs.wait(job.id, backends=self.backends(), slots=self.slots)
            parts = [_("Waiting on {backend}").format(backend=ltr(seen.backend))
                     if seen.backend else _("Waiting on a GPU")]
            eta_s = self.etas.seconds(
                job.id, wait.seconds if wait is not None else None, time.monotonic()
            )
            if eta_s is not None:
                parts.append(_("about {time}").format(time=ltr(render.duration(max(eta_s, 1)))))
            return replies.esc(render.DOT.join(parts))
        if seen.stage is job_state.Stage.RUNNING:
            view = render.JobView(
                id=str(job.id), command=job.command, status="running", backend=seen.backend,
                progress=seen.percent / 100 if seen.percent is not None else None,
                step=seen.step, steps=seen.steps, running_s=seen.running_s,
            )
            return render.status_text(view)
        return final_text(job, detail=self.is_admin(job.user_id))

    async def finish(self, job: jobs.Job) -> None:
        """Turn the status message into the job's end: removed when a result was sent,
        the error sentence when it failed, "Cancelled." when cancelled. Idempotent."""
        if job.status.finished:
            self._ended[job.id] = None
            while len(self._ended) > FINISHED_MEMORY:
                self._ended.popitem(last=False)
        tracked = self._tracked.pop(job.id, None)
        if tracked is not None:
            async with tracked.lock:  # let an edit in flight land before the last word
                tracked.closed = True
        message_id = job.status_message_id or (tracked.message_id if tracked else None)
        if message_id is None or job.id in self._finished or not job.status.finished:
            return
        self._finished[job.id] = None
        while len(self._finished) > FINISHED_MEMORY:
            self._finished.popitem(last=False)
        with i18n.using(await self._language(job)):
            text = final_text(job, detail=self.is_admin(job.user_id))
        self._languages.pop(job.id, None)
        if job.status is jobs.Status.SUCCEEDED or job.id in self._said:
            try:
                await self.bot.delete_message(job.chat_id, message_id)
                return
            except BadRequest as exc:
                if "not found" in exc.message:
                    return  # the user deleted it
                # too old to delete (48 h in groups): say it is done instead
            except RetryAfter as exc:
                # Refused even after the rate limiter's retries: rather than keep trying
                # while the status stays above the result, mark it done at the next chance.
                await asyncio.sleep(retry_seconds(exc))
        # The last edit is a failed or cancelled job's one sentence.
        await _said_for_sure(lambda: self.bot.edit_message_text(
            text, chat_id=job.chat_id, message_id=message_id, parse_mode=ParseMode.HTML,
        ))

    def status_message(self, job: jobs.Job) -> int | None:
        """The status message `job` has here or on record; None when none was posted (its
        post failed, waits for room, or was lost with the process that was to make it)."""
        tracked = self._tracked.get(job.id)
        return job.status_message_id or (tracked.message_id if tracked else None)

    async def say_ending(self, job: jobs.Job, reply_to: int | None) -> None:
        """Say a finished job's ending in a reply to the message that asked for it: the
        job has no status message to turn into it, and the request must not be left with no
        answer of its own. A status message posted after this is removed."""
        self._said[job.id] = None
        while len(self._said) > FINISHED_MEMORY:
            self._said.popitem(last=False)
        with i18n.using(await self._language(job)):
            text = final_text(job, detail=self.is_admin(job.user_id))
        await _said_for_sure(lambda: self.bot.send_message(
            job.chat_id, text, parse_mode=ParseMode.HTML, reply_parameters=_answering(reply_to),
        ))

    # --- loops ----------------------------------------------------------------------

    def _mark(self, job_id: uuid.UUID | None = None, *, queued: bool = False) -> None:
        changed = False
        if job_id is not None:
            tracked = self._tracked.get(job_id)
            if tracked is not None:
                tracked.dirty = changed = True
        if queued:  # someone moved: every queued position may have changed
            for tracked in self._tracked.values():
                if tracked.status is jobs.Status.QUEUED:
                    tracked.dirty = changed = True
        if changed:  # news of jobs nobody watches here wakes nothing
            self._wake.set()

    async def _listen_loop(self) -> None:
        while True:
            try:
                async with self.db.listen([database.UPDATES_CHANNEL]) as listener:
                    self.listening.set()
                    async for note in listener:
                        if note.reconnected:
                            for tracked in self._tracked.values():
                                tracked.dirty = True
                            self._wake.set()
                            continue
                        try:
                            job_id = uuid.UUID(str(note.payload.get("job_id")))
                        except ValueError:
                            continue
                        self._mark(job_id, queued=note.payload.get("event") != "progress")
            except store_errors.StoreError as exc:
                logger.warning("status updates unavailable (%s); polling", exc,
                               extra={"action": "status_listen_failed"})
                await asyncio.sleep(self.fallback_refresh)

    async def _edit_loop(self) -> None:
        last_sweep = time.monotonic()
        while True:
            self._wake.clear()
            now = time.monotonic()
            if now - last_sweep >= self.fallback_refresh:
                last_sweep = now
                for tracked in self._tracked.values():
                    tracked.dirty = True
            wait = self.fallback_refresh - (now - last_sweep)
            due = list(self._tracked.values())
            if not self.room():
                # Results need Telegram's limits now: an edit would be shed anyway, so
                # don't spend the database reads to render one (the news stays dirty).
                wait, due = SHED_PAUSE, []
            # No more renders started than the edit budget could send (see _refresh_locked).
            budget = int(self._available()) - len(self._refreshes)
            for tracked in due:
                if not tracked.dirty or tracked.busy:
                    continue
                if tracked.next_at > now:
                    wait = min(wait, tracked.next_at - now)
                    continue
                if budget <= 0:
                    wait = min(wait, 1.0 / self.edits_per_second)
                    break
                budget -= 1
                tracked.dirty = False
                tracked.busy = True
                task = asyncio.create_task(self._refresh(tracked), name="status-refresh")
                self._refreshes.add(task)
                task.add_done_callback(self._refreshes.discard)
            with contextlib.suppress(TimeoutError):
                await background.wait_for(self._wake.wait(), max(wait, 0.01))

    def _available(self) -> float:
        """Edits the shared budget holds now (a token bucket of one second's edits)."""
        now = time.monotonic()
        rate = self.edits_per_second
        self._tokens = min(rate, self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        return self._tokens

    def _take_token(self) -> bool:
        """One edit from the shared budget."""
        if self._available() < 1.0:
            return False
        self._tokens -= 1.0
        return True

    async def _refresh(self, tracked: _Tracked) -> None:
        try:
            async with self._sem, tracked.lock:
                if tracked.closed:
                    return
                await self._refresh_locked(tracked)
        except store_errors.StoreError as exc:
            logger.info("status not refreshed: %s", exc)
            tracked.dirty = True
        except Exception:
            logger.exception("status refresh failed", extra={"action": "status_failed"})
        finally:
            tracked.busy = False
            self._wake.set()

    async def _refresh_locked(self, tracked: _Tracked) -> None:
        # The edit budget is taken before the database reads that render the text: with
        # a thousand jobs waiting, every claim makes every queued status stale, and
        # rendering them all (a queue position each) would cost more than the edits
        # Telegram would let out. A render that changes nothing gives its token back.
        if not self._take_token():
            tracked.dirty = True  # over the budget: the next free moment shows the news
            tracked.next_at = time.monotonic() + 1.0 / self.edits_per_second
            return
        job = await self.db.jobs.get(tracked.job_id)
        if job is None or job.status.finished:
            # The sink (or the handler) writes the last word; stop following it.
            if job is None:
                self._tracked.pop(tracked.job_id, None)
            self._tokens += 1.0
            return
        tracked.status = job.status
        now_rank = rank(job)
        if now_rank < tracked.rank:
            self._tokens += 1.0
            return  # an older state reported late ("Next on gpu0" after "Running")
        with i18n.using(await self._language(job)):
            text = await self.text_for(job)
            keyboard = cancel_keyboard(job)
        if text == tracked.text:
            self._tokens += 1.0
            return
        interval = self.group_interval if tracked.in_group else self.private_interval
        try:
            await self.bot.edit_message_text(
                text, chat_id=tracked.chat_id, message_id=tracked.message_id,
                parse_mode=ParseMode.HTML, reply_markup=keyboard,
                rate_limit_args=limits.SHED,
            )
            tracked.text = text
            tracked.rank = now_rank
            self.edits += 1
        except limits.Shed:
            # Coalesced: the next chance shows whatever is newest by then.
            self.shed += 1
            tracked.dirty = True
            tracked.next_at = time.monotonic() + SHED_PAUSE
            return
        except RetryAfter as exc:
            tracked.next_at = time.monotonic() + retry_seconds(exc)
            tracked.dirty = True
            logger.info("status edits paused for %.1f s by Telegram", retry_seconds(exc),
                        extra={"action": "status_retry_after"})
            return
        except BadRequest as exc:
            if "not modified" in exc.message:
                tracked.text = text
            elif "not found" in exc.message or "can't be edited" in exc.message:
                self._tracked.pop(tracked.job_id, None)
            else:
                logger.info("status edit refused: %s", exc.message)
        except Forbidden:
            self._tracked.pop(tracked.job_id, None)  # the user blocked the bot
        except TelegramError as exc:
            logger.info("status edit failed: %s", type(exc).__name__)
            tracked.dirty = True
        tracked.next_at = time.monotonic() + interval


# Translated where they are shown, in the job's language.
CANCEL_BUTTON = N_("✖ Cancel")
DONE = N_("Done.")
ALL_OFFLINE = N_("All GPUs are offline; your job runs when one is back — {cancel} to drop it.")

def rank(job: jobs.Job) -> tuple[int, int]:
    """(attempt, stage) of what `job`'s status shows (desk/state.py): queued 0, waiting on
    a GPU 1, running 2. A retry starts a new attempt, which may show "Queued" again."""
    seen = job_state.of(job)
    return seen.attempt, seen.stage.rank


def cancel_keyboard(job: jobs.Job) -> InlineKeyboardMarkup:
    """The Cancel button under a status message (only its user's press counts)."""
    return InlineKeyboardMarkup([[InlineKeyboardButton(
        _(CANCEL_BUTTON), callback_data=callbacks_data.cancel(job.id)
    )]])


def final_text(job: jobs.Job, *, detail: bool = False) -> str:
    """The last text of a status message: the error sentence (with the backend's account
    when `detail`, for admins), or "Cancelled."."""
    if job.status is jobs.Status.FAILED:
        return replies.esc(failures.sentence(job.error, detail=detail))
    if job.status is jobs.Status.CANCELLED:
        return replies.esc(_("Cancelled."))
    return replies.esc(_(DONE))


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value)
    return None
