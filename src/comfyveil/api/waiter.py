"""Waiting for jobs to finish: one LISTEN connection per process wakes the requests whose
job changed, with a slow re-read as a fallback for a notification lost to a reconnect.

A job is read from the database only when its news does not tell enough: a success told
by its notification is not read again (the store writes the status and the outputs in
one statement), news of a job still queued or running (queued, claimed, submitted,
progress: several a job) wakes no read at all, and a job queued while the news ran
without a break (`mark`) is not read before its first news. Each read is a round trip
beside the worker's claim, on the path to every answer (benchmarks/api_overhead.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterator

from comfyveil import tasks as background
from comfyveil.store import database, jobs

logger = logging.getLogger(__name__)

FALLBACK = 2.0  # seconds between re-reads of a job when no notification arrives
RETRY = 1.0  # seconds before listening again after the connection failed
# Jobs whose last news is kept: the jobs of a request queued n at a time, or queued just
# before their wait begins, are told apart from jobs never heard of (those are read).
NEWS_KEPT = 4096


class Waiter:
    def __init__(self, db: database.Database) -> None:
        self.db = db
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._watches: dict[str, set[Watch]] = {}
        # the status each job's last notification named, heard while listening without
        # a break (a reconnect forgets it all: news may have been lost meanwhile)
        self._news: OrderedDict[str, str] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        # counts the breaks in the news (each (re)connect); None while not listening
        self._epoch: int | None = None
        self._breaks = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="api-waiter")

    async def close(self) -> None:
        if self._task is not None:
            await background.cancel_and_wait([self._task])
            self._task = None

    def mark(self) -> int | None:
        """Where the news stands now: taken before queueing, it lets `finished` tell that
        every change of the job since is heard (None: not listening now)."""
        return self._epoch

    def _wake(self, job_id: str | None, status: object = None) -> None:
        """Note a job's news and wake the requests waiting for it (`job_id` None: forget
        all news and wake every request, each to read its job again)."""
        if job_id is None:
            self._news.clear()
            self._lost()
            targets = {e for events in self._waiting.values() for e in events}
            watches = {w for found in self._watches.values() for w in found}
        else:
            self._news.pop(job_id, None)
            self._news[job_id] = status if isinstance(status, str) else ""  # "": unknown
            if len(self._news) > NEWS_KEPT:
                self._news.popitem(last=False)
                self._lost()  # a job's news forgotten: no wait may count on it
            targets = self._waiting.get(job_id, set())
            watches = self._watches.get(job_id, set())
        for event in targets:
            event.set()
        # a break, or news that does not say the job goes on, may be its end
        ended = job_id is None or not _unfinished(status if isinstance(status, str) else None)
        for watch in watches:
            watch.heard(ended=ended)

    def _lost(self) -> None:
        """A break in the news: marks taken before it no longer vouch for a job."""
        self._breaks += 1
        self._epoch = self._breaks

    async def _listen(self) -> None:
        while True:
            try:
                async with self.db.listen([database.UPDATES_CHANNEL]) as listener:
                    self.listening.set()
                    self._wake(None)  # anything that changed before this took hold
                    async for note in listener:
                        job = note.payload.get("job_id")
                        if note.reconnected:
                            self._wake(None)
                        else:
                            self._wake(str(job), note.payload.get("status"))
            except asyncio.CancelledError:
                self._epoch = None
                raise
            except Exception as exc:  # the fallback re-reads meanwhile
                self._news.clear()  # what comes while not listening is not heard
                self._epoch = None
                logger.warning(
                    "the API could not listen for job news: %s",
                    type(exc).__name__,
                    extra={"action": "api_listen_failed"},
                )
                await asyncio.sleep(RETRY)

    @contextlib.contextmanager
    def watching(self, job_id: uuid.UUID) -> Iterator[Watch]:
        """The news of the job as it comes (and each break in the news), for a reader that
        follows every change rather than the end (the jobs API's stream)."""
        key = str(job_id)
        watch = Watch()
        self._watches.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            found = self._watches.get(key)
            if found is not None:
                found.discard(watch)
                if not found:
                    del self._watches[key]

    async def finished(
        self, job_id: uuid.UUID, *, queued_at: int | None = None
    ) -> tuple[jobs.Status | None, jobs.Job | None]:
        """How the job ended (None: it is gone, e.g. forgotten meanwhile), with the job as
        read then (None for a success told by its notification). `queued_at`: `mark()`
        taken before the job was queued (and seen queued): while the news has had no break
        since, a job with no news yet is still queued, so it is not read."""
        key = str(job_id)
        event = asyncio.Event()
        self._waiting.setdefault(key, set()).add(event)
        stale = False  # after the fallback's wait: read, whatever the news said
        try:
            while True:
                event.clear()  # before the read: news after it wakes the wait below
                news = self._news.get(key)
                if news == jobs.Status.SUCCEEDED:
                    return jobs.Status.SUCCEEDED, None
                heard = queued_at is not None and queued_at == self._epoch
                if stale or not (_unfinished(news) or (news is None and heard)):
                    job = await self.db.jobs.get(job_id)
                    if job is None:
                        return None, None
                    if job.status.finished:
                        return job.status, job
                try:
                    await background.wait_for(event.wait(), FALLBACK)
                    stale = False
                except TimeoutError:
                    stale = True
        finally:
            events = self._waiting.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiting[key]
                    self._news.pop(key, None)


class Watch:
    """What a reader following one job has heard since it last read the job: `news`, set
    on each notification of the job and after each break in the news; `ended`, set only
    when one of them may be the job's end (a final status, an unknown word, a break)."""

    def __init__(self) -> None:
        self.news = asyncio.Event()
        self.ended = asyncio.Event()

    def heard(self, *, ended: bool) -> None:
        self.news.set()
        if ended:
            self.ended.set()

    def clear(self) -> None:
        """Before a read: what is heard after it is news again."""
        self.news.clear()
        self.ended.clear()


def _unfinished(status: str | None) -> bool:
    """Whether a notification's status says the job is still queued or running (None,
    an unknown word: it does not say)."""
    try:
        return status is not None and not jobs.Status(status).finished
    except ValueError:
        return False
