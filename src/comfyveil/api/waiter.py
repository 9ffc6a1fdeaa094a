"""Waiting for jobs to finish: one LISTEN connection per process wakes the requests whose
job changed, with a slow re-read as a fallback for a notification lost to a reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from comfyveil import tasks as background
from comfyveil.store import database, jobs

logger = logging.getLogger(__name__)

FALLBACK = 2.0  # seconds between re-reads of a job when no notification arrives
RETRY = 1.0  # seconds before listening again after the connection failed


class Waiter:
    def __init__(self, db: database.Database) -> None:
        self.db = db
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._news: dict[str, str] = {}  # the status a job's last notification named
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="api-waiter")

    async def close(self) -> None:
        if self._task is not None:
            await background.cancel_and_wait([self._task])
            self._task = None

    def _wake(self, job_id: str | None, status: object = None) -> None:
        if job_id is not None and job_id in self._waiting and isinstance(status, str):
            self._news[job_id] = status
        targets = (
            self._waiting.get(job_id, set())
            if job_id is not None
            else {e for events in self._waiting.values() for e in events}
        )
        for event in targets:
            event.set()

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
                raise
            except Exception as exc:  # the fallback re-reads meanwhile
                logger.warning(
                    "the API could not listen for job news: %s",
                    type(exc).__name__,
                    extra={"action": "api_listen_failed"},
                )
                await asyncio.sleep(RETRY)

    async def finished(self, job_id: uuid.UUID) -> tuple[jobs.Status | None, jobs.Job | None]:
        """How the job ended (None: it is gone, e.g. forgotten meanwhile), with the job as
        read then; a success told by its notification is not read again (the store writes
        the status and the outputs in one statement, so they are there)."""
        key = str(job_id)
        event = asyncio.Event()
        self._waiting.setdefault(key, set()).add(event)
        try:
            while True:
                event.clear()  # before the read: news after it wakes the wait below
                if self._news.get(key) == jobs.Status.SUCCEEDED:
                    return jobs.Status.SUCCEEDED, None
                job = await self.db.jobs.get(job_id)
                if job is None:
                    return None, None
                if job.status.finished:
                    return job.status, job
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), FALLBACK)
        finally:
            events = self._waiting.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiting[key]
                    self._news.pop(key, None)
