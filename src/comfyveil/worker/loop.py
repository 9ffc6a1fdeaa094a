"""The worker's loop: claiming jobs while a backend has a free slot, and the side tasks
that renew leases, LISTEN for news of the queue and recover expired leases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence

from comfyveil import sinks as sinks_mod
from comfyveil import tasks as background
from comfyveil.comfy import pool, workflow
from comfyveil.store import database, job_leases, jobs
from comfyveil.store import errors as store_errors
from comfyveil.worker.cancel import Cancelling
from comfyveil.worker.job import JobRunner
from comfyveil.worker.options import (
    DB_RETRY_DELAY,
    FINAL_EVENTS,
    HANDBACK_RESERVE,
    HANDBACK_SHARE,
    WorkerOptions,
    default_worker_id,
)
from comfyveil.worker.progress import Reporting
from comfyveil.worker.running import Running
from comfyveil.worker.settle import Settling, back_of

logger = logging.getLogger("comfyveil.worker")  # the name it logged under before the split


class Worker(JobRunner, Reporting, Cancelling, Settling):
    """Claims and runs jobs until `stop()`.

    Args:
        db: the opened database.
        backends: the backend pool (opened by the caller).
        sinks: where finished jobs are delivered.
        options: intervals and limits.
    """

    def __init__(
        self,
        db: database.Database,
        backends: pool.Pool,
        *,
        sinks: Sequence[sinks_mod.DeliverySink] = (),
        options: WorkerOptions | None = None,
    ) -> None:
        self.db = db
        self.store = db.jobs
        self.pool = backends
        self.sinks = tuple(sinks)
        self.options = options or WorkerOptions()
        self.worker_id = self.options.worker_id or default_worker_id()
        self._running: dict[uuid.UUID, Running] = {}
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._stop_deadline: float | None = None  # time.monotonic() when stopped for good
        self._workflows: dict[str, workflow.Workflow] = {}
        self._avoid: dict[uuid.UUID, str] = {}  # the backend a job last failed on
        # Prompts an earlier attempt left on a backend that could not be reached to take
        # them back (backend name -> prompt ids); taken back once it answers again.
        self._orphans: dict[str, set[str]] = {}
        # Claims that found nothing are not repeated each time a slot frees up, only after
        # news of the queue. A NOTIFY of a queued job is news of one job (_job_news counts
        # them); a LISTEN reconnect, recovered leases or the poll interval are news of an
        # unknown amount (_other_news). _found_empty is (both counts when the queue was
        # last known empty, the backends asked for; None: any): after it, a claim asks for
        # no more jobs than were announced since, so one queued job costs one claim.
        self._job_news = 0
        self._other_news = 0
        self._found_empty: tuple[int, int, frozenset[str] | None] | None = None
        self._delivering: set[uuid.UUID] = set()
        # Per sink, deliveries that failed here because its destination was down: tried
        # again as soon as the sink says it is back (oldest first).
        self._waiting_back: dict[str, dict[uuid.UUID, None]] = {}
        # Jobs this worker cancelled itself, newest last: news of the cancel may come after
        # the job's task is gone, and is then not news of a cancel elsewhere.
        self._cancelled_here: dict[uuid.UUID, None] = {}
        # The last claim took all it asked for: more jobs may wait in the queue, so a job
        # takes a free GPU rather than wait for a better busy one (pool.acquire's behind).
        self._more_queued = False
        self._side: list[asyncio.Task[None]] = []
        self._cancels: set[asyncio.Task[None]] = set()
        self._side_tasks: set[asyncio.Task[None]] = set()  # progress writes in flight
        self.stopped = asyncio.Event()

    # --- life cycle ----------------------------------------------------------------

    def stop(self, *, deadline: float | None = None) -> None:
        """Stop claiming; stopped by `deadline` (a `time.monotonic()`; default: the
        grace period from now), running jobs finished or handed back. The first call's
        deadline holds: it is measured from the signal, not from when the loop notices.
        """
        if self._stop_deadline is None:
            self._stop_deadline = (
                deadline if deadline is not None
                else time.monotonic() + self.options.shutdown_grace
            )
        self._stop.set()
        self._wake.set()

    @property
    def running_jobs(self) -> list[uuid.UUID]:
        return list(self._running)

    async def run(self) -> None:
        """Run until `stop()`; if cancelled, shut down cleanly first."""
        task = asyncio.ensure_future(self._run_loop())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            self.stop()
            await task
            raise

    async def _run_loop(self) -> None:
        logger.info(
            "worker %s started",
            self.worker_id,
            extra={"action": "worker_started", "worker": self.worker_id},
        )
        opts = self.options
        await self._take_back_own()
        self._side = [
            asyncio.create_task(self._renew_loop(), name=f"{self.worker_id}-leases"),
            asyncio.create_task(self._recover_loop(), name=f"{self.worker_id}-recover"),
            asyncio.create_task(self._deliver_loop(), name=f"{self.worker_id}-deliver"),
            *(
                asyncio.create_task(self._deliver_when_back(sink), name=f"{sink.name}-back")
                for sink in self.sinks
                if back_of(sink) is not None
            ),
        ]
        if opts.listen:
            self._side.append(
                asyncio.create_task(self._listen_loop(), name=f"{self.worker_id}-listen")
            )
        try:
            while not self._stop.is_set():
                self._wake.clear()
                await self._fill()
                try:
                    async with asyncio.timeout(opts.poll_interval):
                        await self._wake.wait()
                except TimeoutError:
                    self._other_news += 1  # backoffs end and notifications get lost
        finally:
            await self._shutdown()
            if self._side_tasks:  # the last progress writes (they end on their own)
                await asyncio.wait(
                    list(self._side_tasks),
                    timeout=min(DB_RETRY_DELAY * 4, max(0.0, self._left())),
                )
            await background.cancel_and_wait(self._side)
            self.stopped.set()
            logger.info(
                "worker %s stopped",
                self.worker_id,
                extra={"action": "worker_stopped", "worker": self.worker_id},
            )

    def _left(self) -> float:
        """Seconds until the stop deadline (the grace period when none was set)."""
        if self._stop_deadline is None:
            return self.options.shutdown_grace
        return self._stop_deadline - time.monotonic()

    async def _shutdown(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if not tasks:
            return
        left = self._left()
        # Part of what is left is kept for the hand-back writes, so the whole stop, not
        # only the jobs' wait, ends by the deadline (Docker kills at 10 s).
        reserve = min(HANDBACK_RESERVE, max(0.0, left) * HANDBACK_SHARE)
        wait = max(0.0, left - reserve)
        logger.info(
            "waiting up to %.1f s for %d running job(s)",
            wait,
            len(tasks),
            extra={"action": "worker_draining"},
        )
        pending = set(tasks)
        if wait > 0:
            _, pending = await asyncio.wait(tasks, timeout=wait)
        for task in pending:
            task.cancel()  # the job task hands its job back under shield
        if pending:
            # A hand-back not written by then is left to the lease's expiry (recovered by
            # the next worker) rather than overrun the deadline.
            _, late = await asyncio.wait(pending, timeout=max(0.1, self._left()))
            if late:
                logger.warning(
                    "%d job(s) not handed back before the stop deadline; their leases "
                    "expire and another worker recovers them", len(late),
                    extra={"action": "worker_handback_late"},
                )

    # --- claiming ------------------------------------------------------------------

    async def _fill(self) -> None:
        """Claim as many jobs as backends have free slots, all at once.

        Jobs claimed but not yet placed on a backend count against the free slots (they
        are about to take them); a job of ours that waits for a GPU stops claiming, so
        the database, not this process, holds the waiting work.
        """
        while not self._stop.is_set():
            if any(r.waiting for r in self._running.values()):
                return  # one of ours already waits for a GPU: leave the rest queued
            free = self.pool.free_slots()
            unplaced = sum(1 for r in self._running.values() if not r.placed.is_set())
            if free:
                want = sum(free.values()) - unplaced
            elif self.pool.any_healthy or unplaced:
                return
            else:
                # All backends down: take one job anyway so its user hears "waiting for a
                # GPU".
                want = 1
            if want <= 0:
                return
            names = list(free) or None
            asked = frozenset(names) if names is not None else None
            announced = self._announced_since_empty(asked)
            if announced is not None:
                if announced <= 0:
                    return
                want = min(want, announced)
            job_news, other_news = self._job_news, self._other_news
            claims = await asyncio.gather(
                *(
                    self.store.claim(
                        self.worker_id, backends=names, lease_seconds=self.options.lease_seconds
                    )
                    for _ in range(want)
                ),
                return_exceptions=True,
            )
            failure: BaseException | None = None
            claimed = 0
            for outcome in claims:
                if isinstance(outcome, BaseException):
                    failure = outcome
                elif outcome is not None:
                    claimed += 1
                    self._start(outcome)
            if failure is not None:
                if not isinstance(failure, store_errors.StoreError):
                    raise failure
                logger.warning("cannot claim jobs: %s", failure, extra={"action": "claim_failed"})
                await self._sleep(DB_RETRY_DELAY * 4)
                return
            self._more_queued = claimed >= want
            if claimed < want:
                if self.options.listen:  # without LISTEN no news comes: keep asking
                    self._found_empty = (job_news, other_news, asked)
                return  # the queue is empty (for our free backends)
            if announced is not None and self._found_empty is not None:
                # Those announced jobs are taken: what is left was announced after them.
                seen, other, empty_for = self._found_empty
                self._found_empty = (seen + claimed, other, empty_for)

    def _queue_changed(self, *, one_job: bool = False) -> None:
        """The queue may hold new work (`one_job`: exactly one more job was queued)."""
        if one_job:
            self._job_news += 1
        else:
            self._other_news += 1
        self._wake.set()

    def _announced_since_empty(self, asked: frozenset[str] | None) -> int | None:
        """How many jobs were queued since a claim for `asked` backends found nothing, as
        far as the notifications tell; None when unknown (no such claim, or other news)."""
        if self._found_empty is None:
            return None
        seen, other, empty_for = self._found_empty
        if other != self._other_news:
            return None
        if not (empty_for is None or (asked is not None and asked <= empty_for)):
            return None
        return self._job_news - seen

    def _start(self, job: jobs.Job) -> None:
        running = Running(job)
        self._running[job.id] = running
        running.task = asyncio.create_task(self._process(running), name=f"job-{job.id}")
        running.task.add_done_callback(lambda _t, jid=job.id: self._finished(jid))

    def _finished(self, job_id: uuid.UUID) -> None:
        self._running.pop(job_id, None)
        self._wake.set()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await background.wait_for(self._stop.wait(), seconds)

    # --- side tasks ----------------------------------------------------------------

    async def _take_back_own(self) -> None:
        """Jobs an earlier run under this worker id held when it died go back to the queue
        at once (keeping the backend their prompt went to, to re-attach to it), instead of
        waiting for their leases to run out: no other process holds them."""
        if not self.options.worker_id:
            return  # a generated id is new: no earlier run had it
        try:
            taken = await self.store.requeue_own(self.worker_id)
        except store_errors.StoreError as exc:
            logger.warning(
                "cannot take back this worker's earlier jobs now: %s",
                exc,
                extra={"action": "take_back_failed"},
            )
            return
        if taken:
            logger.info(
                "took back %d job(s) of this worker's earlier run",
                len(taken),
                extra={"action": "jobs_taken_back", "worker": self.worker_id},
            )
            self._queue_changed()

    async def _renew_loop(self) -> None:
        """Renew the leases every third of a lease; while the database cannot be reached,
        try again every DB_RETRY_DELAY, so that they are renewed as soon as it is back."""
        interval = self.options.lease_seconds / 3
        delay = interval
        unreachable = False
        url = getattr(self.db, "url", None)
        line = job_leases.LeaseLine(url) if isinstance(url, str) else None
        try:
            while True:
                await asyncio.sleep(delay)
                delay = interval
                unreachable = await self._renew_all(line, unreachable)
                if unreachable:
                    delay = DB_RETRY_DELAY
        finally:
            if line is not None:
                await line.close()

    async def _renew_all(self, line: job_leases.LeaseLine | None, unreachable: bool) -> bool:
        """One round of renewals; whether the database could not be reached."""
        # Jobs whose final status is being written are renewed too: the write may wait
        # for the database to come back, and must not find the job taken over then.
        for running in list(self._running.values()):
            try:
                if line is not None:
                    renewed = await line.renew(running.job, self.options.lease_seconds)
                else:
                    renewed = await self.store.renew_lease(
                        running.job, self.options.lease_seconds
                    )
            except store_errors.LeaseLost:
                if running.settled:
                    continue  # the final status landed while the renewal was in flight
                logger.warning(
                    "lease lost; dropping the job here",
                    extra={"action": "lease_lost", "job_id": str(running.job.id)},
                )
                running.cancelling = True
                if running.task is not None:
                    running.task.cancel()
                continue
            except store_errors.StoreError as exc:
                if not unreachable:
                    logger.warning(
                        "cannot renew leases: %s", exc, extra={"action": "renew_failed"}
                    )
                return True
            if unreachable:
                unreachable = False
                logger.info("leases renewed again", extra={"action": "renew_resumed"})
            if renewed.cancel_requested and not running.settled:
                self._request_cancel(running)
        return False

    async def _listen_loop(self) -> None:
        while True:
            try:
                async with self.db.listen() as listener:
                    # Jobs queued before LISTEN took hold sent their NOTIFY to no one.
                    self._queue_changed()
                    async for note in listener:
                        if note.reconnected:
                            self._queue_changed()
                            continue
                        if note.channel == database.JOBS_CHANNEL:
                            self._queue_changed(one_job=True)
                            continue
                        event = note.payload.get("event")
                        if event == "cancel_requested":
                            with contextlib.suppress(ValueError, TypeError):
                                running = self._running.get(uuid.UUID(note.payload["job_id"]))
                                if running is not None:
                                    self._request_cancel(running)
                        elif event in FINAL_EVENTS:
                            with contextlib.suppress(ValueError, TypeError):
                                self._finished_elsewhere(uuid.UUID(note.payload["job_id"]))
                        if note.payload.get("status") == "cancelled":
                            with contextlib.suppress(ValueError, TypeError):
                                self._cancelled_elsewhere(uuid.UUID(note.payload["job_id"]))
            except store_errors.StoreError as exc:
                logger.warning(
                    "LISTEN unavailable (%s); polling", exc, extra={"action": "listen_failed"}
                )
                await asyncio.sleep(self.options.poll_interval)

    async def _recover_loop(self) -> None:
        # A sixth: a dead worker's job is taken over at most a sixth of a lease after it ran out.
        interval = self.options.recover_interval or self.options.lease_seconds / 6
        while True:
            try:
                recovered = await self.store.recover_expired(self.options.lease_seconds)
            except store_errors.StoreError as exc:
                logger.info("cannot recover expired leases now: %s", exc)
                recovered = []
            if recovered:
                self._queue_changed()
                for job in recovered:
                    if job.status.finished:
                        await self._deliver(job, [])
            if self._orphans:
                await self._withdraw_orphans()
            await asyncio.sleep(interval)
