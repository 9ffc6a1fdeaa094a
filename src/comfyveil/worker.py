"""The worker: claims jobs from PostgreSQL, runs them on the backend pool, reports back.

The loop, in the manner of procrastinate's worker:

- side tasks: lease renewal (which also notices cancel requests), LISTEN for new jobs and
  job updates (with polling as the fallback), expired-lease recovery, re-delivery of
  finished jobs whose delivery was never recorded; the pool runs its own health probes.
- the main loop claims jobs only while a backend has a free slot (so the database, not
  this process, holds the waiting work), each job runs as a named task, then it waits for
  the first of: a NOTIFY, a freed slot, the poll interval, a stop request.
- the job id is ComfyUI's prompt_id. A job whose prompt a backend already accepted (a
  worker died after submitting it) is re-attached with `client.follow` instead of being
  submitted again, so the GPU work is never paid twice.
- transient failures (backend unreachable or restarted) go back to the queue with backoff
  and run on another backend; permanent ones (bad parameters, a missing model, an
  execution error) fail at once with the plain message.
- the final status of a job is written under `asyncio.shield`; a stop asks running jobs to
  finish within a grace period and hands the others back (re-attached by the next worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import mimetypes
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from comfyveil import sinks as sinks_mod
from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import events, execute, pool, workflow
from comfyveil.errors import ComfyveilError, UsageError
from comfyveil.store import database, jobs
from comfyveil.store import errors as store_errors

logger = logging.getLogger(__name__)

POLL_INTERVAL = 5.0  # seconds between two looks at the queue when no NOTIFY arrives
LEASE_SECONDS = 30.0  # a job's lease; renewed every third of it
FINAL_EVENTS = frozenset({"succeeded", "failed", "cancelled"})  # job_events kinds that end a job
DELIVERY_CLAIM_SECONDS = 120.0  # a catch-up delivery's claim; another worker may retry after
SHUTDOWN_GRACE = 30.0  # seconds running jobs get to finish on stop before being handed back
RETRY_BACKOFF = 2.0  # seconds before the first retry of a transient failure, then doubled
RETRY_BACKOFF_MAX = 120.0  # seconds
DELIVERY_GRACE = 30.0  # seconds after a job ended before another worker re-delivers it
DB_RETRY_DELAY = 0.5  # seconds between tries of a write while the database is unreachable
PROGRESS_INTERVAL = 0.5  # seconds between two progress writes of one job
PROGRESS_SETTLE = 0.2  # seconds a change of state (waiting, queued, running) waits to be written

T = TypeVar("T")


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker behaves; the defaults suit production, tests shorten the times."""

    worker_id: str = ""  # default: host-pid-random
    lease_seconds: float = LEASE_SECONDS
    poll_interval: float = POLL_INTERVAL
    job_timeout: float = 1800.0
    shutdown_grace: float = SHUTDOWN_GRACE
    retry_backoff: float = RETRY_BACKOFF
    recover_interval: float | None = None  # default: half the lease
    delivery_grace: float = DELIVERY_GRACE
    listen: bool = True  # LISTEN for NOTIFY; False: polling only


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(eq=False)
class _Running:
    job: jobs.Job
    task: asyncio.Task[None] | None = None
    placed: asyncio.Event = field(default_factory=asyncio.Event)  # has a slot, or waits
    waiting: bool = False  # waits in the pool for a free GPU
    slot: pool.Slot | None = None
    cancel_requested: bool = False
    cancelling: bool = False
    # The final status is being written (or was): no more lease renewals or progress
    # writes. A renewal or progress write landing after that write finds the job no longer
    # running; it must not read that as a lost lease and cancel the delivery that follows.
    settled: bool = False
    progress_at: float = field(default_factory=time.monotonic)  # the last write (or claim)
    progress_due: float = math.inf  # when progress_next is written
    progress_sooner: asyncio.Event = field(default_factory=asyncio.Event)  # due moved earlier
    progress_next: dict[str, Any] | None = None  # the newest progress not yet written
    progress_task: asyncio.Task[None] | None = None
    progress_closed: bool = False  # the job left the backend: no more progress writes


class Worker:
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
        self._running: dict[uuid.UUID, _Running] = {}
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._workflows: dict[str, workflow.Workflow] = {}
        self._avoid: dict[uuid.UUID, str] = {}  # the backend a job last failed on
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
        self._side: list[asyncio.Task[None]] = []
        self._cancels: set[asyncio.Task[None]] = set()
        self._side_tasks: set[asyncio.Task[None]] = set()  # progress writes in flight
        self.stopped = asyncio.Event()

    # --- life cycle ----------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs get the grace period. Idempotent."""
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
        logger.info("worker %s started", self.worker_id,
                    extra={"action": "worker_started", "worker": self.worker_id})
        opts = self.options
        self._side = [
            asyncio.create_task(self._renew_loop(), name=f"{self.worker_id}-leases"),
            asyncio.create_task(self._recover_loop(), name=f"{self.worker_id}-recover"),
            asyncio.create_task(self._deliver_loop(), name=f"{self.worker_id}-deliver"),
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
                await asyncio.wait(list(self._side_tasks), timeout=DB_RETRY_DELAY * 4)
            for side in self._side:
                side.cancel()
            for side in self._side:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await side
            self.stopped.set()
            logger.info("worker %s stopped", self.worker_id,
                        extra={"action": "worker_stopped", "worker": self.worker_id})

    async def _shutdown(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if not tasks:
            return
        logger.info("waiting up to %.0f s for %d running job(s)", self.options.shutdown_grace,
                    len(tasks), extra={"action": "worker_draining"})
        _, pending = await asyncio.wait(tasks, timeout=self.options.shutdown_grace)
        for task in pending:
            task.cancel()  # the job task hands its job back under shield
        if pending:
            await asyncio.wait(pending)

    # --- claiming ----------------------------------------------------------------

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
                *(self.store.claim(self.worker_id, backends=names,
                                   lease_seconds=self.options.lease_seconds)
                  for _ in range(want)),
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
                logger.warning("cannot claim jobs: %s", failure,
                               extra={"action": "claim_failed"})
                await self._sleep(DB_RETRY_DELAY * 4)
                return
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
        running = _Running(job)
        self._running[job.id] = running
        running.task = asyncio.create_task(self._process(running), name=f"job-{job.id}")
        running.task.add_done_callback(lambda _t, jid=job.id: self._finished(jid))

    def _finished(self, job_id: uuid.UUID) -> None:
        self._running.pop(job_id, None)
        self._wake.set()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    # --- one job ------------------------------------------------------------------

    async def _process(self, running: _Running) -> None:
        job = running.job
        log_extra = {"job_id": str(job.id), "worker": self.worker_id}
        try:
            try:
                outputs = await self._execute(running)
            finally:
                running.progress_closed = True
                await self._release_slot(running)
                running.placed.set()
        except asyncio.CancelledError:
            if running.cancel_requested:
                await self._settle(running, lambda: self._mark_cancelled(running))
            else:
                await self._settle(running, lambda: self._hand_back(running))
                raise
            return
        except comfy_errors.Interrupted as exc:
            message = str(exc)
            if running.cancel_requested:
                await self._settle(running, lambda: self._mark_cancelled(running))
            else:
                await self._settle(
                    running, lambda: self._fail(running, message, transient=False)
                )
            return
        except store_errors.LeaseLost:
            logger.warning("lost the lease of a job; another worker has it",
                           extra={"action": "lease_lost", **log_extra})
            return
        except (comfy_errors.ComfyError, UsageError, workflow.WorkflowError) as exc:
            transient = bool(getattr(exc, "transient", False))
            message = str(exc)
            if running.cancel_requested:
                await self._settle(running, lambda: self._mark_cancelled(running))
                return
            if transient and isinstance(exc, comfy_errors.ComfyError):
                backend = self.pool.get(exc.backend)
                if backend is not None:
                    self._avoid[job.id] = backend.name
                    if isinstance(exc, comfy_errors.BackendUnreachable | comfy_errors.JobLost):
                        await self.pool.mark_down(backend, str(exc))
            await self._settle(
                running, lambda: self._fail(running, message, transient=transient)
            )
            return
        except store_errors.StoreError as exc:
            logger.warning("database error while running a job: %s", exc,
                           extra={"action": "job_store_error", **log_extra})
            return  # the lease expires and the job is recovered (re-attached) elsewhere
        except Exception:
            logger.exception("unexpected error while running a job",
                             extra={"action": "job_crashed", **log_extra})
            await self._settle(running, lambda: self._fail(
                running, "the job failed because of an internal error; it will be retried",
                transient=True,
            ))
            return
        try:
            done = await self._settle(running, lambda: self._complete(running, outputs))
        except store_errors.LeaseLost:
            return
        if done is not None:
            self._avoid.pop(job.id, None)
            # Shielded: a result half sent to the user must not be sent again later.
            await asyncio.shield(self._deliver(done, outputs, claimed=True))

    async def _settle(
        self, running: _Running, write: Callable[[], Awaitable[T]]
    ) -> T | None:
        """Write a job's final status: shielded from cancellation, retried while the
        database is unreachable (up to twice the lease; after that the job has been
        recovered by another worker, which re-attaches to its prompt)."""
        # The lease ends with the final status: from the moment it is being written, a
        # renewal or progress write would fail and cancel the delivery that follows
        # (which then ran twice, or late from another worker's deliver loop).
        running.settled = True
        running.progress_closed = True
        task = asyncio.ensure_future(self._retry_db(write, running))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await task
            raise

    async def _retry_db(
        self, write: Callable[[], Awaitable[T]], running: _Running
    ) -> T | None:
        deadline = time.monotonic() + self.options.lease_seconds * 2
        while True:
            try:
                return await write()
            except store_errors.LeaseLost:
                logger.warning("job was taken over before its result was saved",
                               extra={"action": "lease_lost", "job_id": str(running.job.id)})
                return None
            except store_errors.DatabaseUnreachable as exc:
                if time.monotonic() > deadline:
                    logger.error("could not save a job's result: %s", exc,
                                 extra={"action": "job_unsaved", "job_id": str(running.job.id)})
                    return None
                await asyncio.sleep(DB_RETRY_DELAY)

    async def _workflow(self, job: jobs.Job) -> workflow.Workflow:
        cached = self._workflows.get(job.workflow_hash)
        if cached is not None:
            return cached
        command = await self.db.commands.get(job.command)
        if command is None:
            raise UsageError(f"the command /{job.command} no longer exists")
        wf = command.to_workflow()
        self._workflows[wf.hash] = wf
        return wf

    async def _execute(self, running: _Running) -> list[jobs.Output]:
        job = running.job
        wf = await self._workflow(job)
        # A command changed since the job was queued: check the values again.
        values = wf.validate(job.params) if wf.hash != job.workflow_hash else dict(job.params)
        prompt_id = str(job.id)

        if job.submitted and job.backend and self.pool.get(job.backend) is not None:
            running.slot = self.pool.take(job.backend, prompt_id)
            running.placed.set()
            assert running.slot is not None
            backend = running.slot.backend
            logger.info("re-attaching to a job on backend %s", backend.name,
                        extra={"action": "job_reattach", "job_id": prompt_id})
            try:
                outcome = await self._run_on(running, wf, values, backend, attach=True)
            except comfy_errors.JobLost:
                # It never reached the GPU, or the backend restarted and forgot it: run it
                # afresh on the same backend, within the same attempt.
                logger.info("backend %s no longer knows the job; submitting it again",
                            backend.name, extra={"action": "job_resubmit", "job_id": prompt_id})
                outcome = await self._run_on(running, wf, values, backend, attach=False)
        else:
            async def waiting(text: str) -> None:
                running.waiting = True
                running.placed.set()
                self._record_progress(running, {"state": "waiting", "text": text}, force=True)

            try:
                running.slot = await self.pool.acquire(
                    wf, prompt_id, on_wait=waiting, avoid=self._avoid.get(job.id)
                )
            finally:
                if running.waiting:
                    running.waiting = False
                    self._wake.set()  # the queue may hold work for more free slots now
            running.placed.set()
            backend = running.slot.backend
            # Recorded before the prompt is posted: a successor then looks for it there
            # first, and submits it again only if that backend never got it (JobLost).
            running.job = await self.store.mark_submitted(job, backend.name)
            outcome = await self._run_on(running, wf, values, backend, attach=False)
        return [
            jobs.Output(
                filename=item.file.filename, kind=item.file.kind,
                mime=mimetypes.guess_type(item.file.filename)[0] or "application/octet-stream",
                data=item.data, index=index,
            )
            for index, item in enumerate(outcome.files)
        ]

    async def _run_on(
        self, running: _Running, wf: workflow.Workflow, values: Mapping[str, object],
        backend: pool.Backend, *, attach: bool,
    ) -> execute.Outcome:
        job = running.job
        inputs: dict[str, execute.InputImage] = {}
        if not attach:
            images = await self.store.inputs(job.id) if wf.image_params else []
            for name, image in zip(wf.image_params, images, strict=False):
                inputs[name] = execute.InputImage(image.data, image.mime)
            self._record_progress(
                running, {"state": "submitted", "backend": backend.name}, force=True
            )
        return await execute.execute(
            backend.client, wf, values, inputs, prompt_id=str(job.id),
            on_event=self._progress_callback(running), timeout=self.options.job_timeout,
            attach=attach, on_ran=lambda: self._release_slot(running),
        )

    async def _release_slot(self, running: _Running) -> None:
        slot, running.slot = running.slot, None
        if slot is not None:
            await self.pool.release(slot)
            self._wake.set()

    # --- final writes --------------------------------------------------------------

    async def _complete(self, running: _Running, outputs: list[jobs.Output]) -> jobs.Job:
        return await self.store.complete(
            running.job, outputs, claim_for=[sink.name for sink in self.sinks],
            claim_seconds=DELIVERY_CLAIM_SECONDS,
        )

    async def _fail(self, running: _Running, message: str, *, transient: bool) -> jobs.Job:
        job = running.job
        backoff = min(RETRY_BACKOFF_MAX,
                      self.options.retry_backoff * 2 ** max(0, job.attempts - 1))
        failed = await self.store.fail(job, message, transient=transient, backoff=backoff)
        if failed.status is jobs.Status.QUEUED:
            logger.info("job will be retried", extra={"action": "job_retry",
                                                      "job_id": str(job.id)})
        else:
            self._avoid.pop(job.id, None)
            logger.info("job failed: %s", message,
                        extra={"action": "job_failed", "job_id": str(job.id)})
            await self._deliver(failed, [])
        return failed

    async def _mark_cancelled(self, running: _Running) -> jobs.Job:
        cancelled = await self.store.mark_cancelled(running.job)
        logger.info("job cancelled", extra={"action": "job_cancelled",
                                            "job_id": str(running.job.id)})
        await self._deliver(cancelled, [])
        return cancelled

    async def _hand_back(self, running: _Running) -> jobs.Job:
        released = await self.store.release(running.job)
        logger.info("job handed back", extra={"action": "job_released",
                                              "job_id": str(running.job.id)})
        return released

    # --- progress and cancellation ------------------------------------------------

    def _progress_callback(
        self, running: _Running
    ) -> Callable[[events.Event], Awaitable[None]]:
        async def on_event(event: events.Event) -> None:
            data: dict[str, Any] | None = None
            force = False
            if isinstance(event, events.QueuePosition):
                data = {"state": "queued_on_backend", "position": event.position}
                force = True
            elif isinstance(event, events.ExecutionStart):
                data = {"state": "running"}
                force = True
            elif isinstance(event, events.Executing) and event.node is not None:
                data = {"state": "running", "node": event.node}
            elif isinstance(event, events.Progress):
                percent = round(100.0 * event.value / event.max, 1) if event.max else None
                data = {"state": "running", "node": event.node, "value": event.value,
                        "max": event.max, "percent": percent}
            if data is not None:
                slot = running.slot
                if slot is not None:
                    data["backend"] = slot.backend.name
                self._record_progress(running, data, force=force)
        return on_event

    def _record_progress(
        self, running: _Running, data: Mapping[str, Any], *, force: bool = False
    ) -> None:
        """Save the job's progress in the background, the latest first.

        The job never waits for its progress row: events from the backend keep flowing
        while a write is pending, and they collapse into the newest one. Writes trail the
        events, a change of state by PROGRESS_SETTLE, progress by up to PROGRESS_INTERVAL
        after the last write, so a job that ends sooner writes none: its final status says
        all. A cancel request read back with a write cancels the job.
        """
        if running.progress_closed:
            return
        now = time.monotonic()
        due = now + PROGRESS_SETTLE if force else max(now, running.progress_at + PROGRESS_INTERVAL)
        if due < running.progress_due:
            running.progress_due = due
            running.progress_sooner.set()
        running.progress_next = dict(data)
        if running.progress_task is None or running.progress_task.done():
            task = asyncio.create_task(self._write_progress(running),
                                       name=f"progress-{running.job.id}")
            running.progress_task = task
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)

    async def _write_progress(self, running: _Running) -> None:
        while running.progress_next is not None and not running.progress_closed:
            while (wait := running.progress_due - time.monotonic()) > 0:
                running.progress_sooner.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(running.progress_sooner.wait(), wait)
            if running.progress_closed or running.progress_next is None:
                return
            data, running.progress_next = running.progress_next, None
            running.progress_at, running.progress_due = time.monotonic(), math.inf
            try:
                cancel = await self.store.record_progress(running.job, data)
            except store_errors.LeaseLost:
                if running.progress_closed or running.settled:
                    return  # the job ended meanwhile: its final status is the last word
                logger.warning("lease lost; dropping the job here",
                               extra={"action": "lease_lost", "job_id": str(running.job.id)})
                running.cancelling = True
                if running.task is not None and not running.task.done():
                    running.task.cancel()
                return
            except store_errors.StoreError as exc:  # progress is best effort
                logger.info("progress not saved: %s", exc, extra={"action": "progress_unsaved"})
                continue
            if cancel:
                self._request_cancel(running)

    def _request_cancel(self, running: _Running) -> None:
        if running.cancelling:
            return
        running.cancel_requested = True
        running.cancelling = True
        task = asyncio.create_task(self._cancel(running), name=f"cancel-{running.job.id}")
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _cancel(self, running: _Running) -> None:
        """Stop this one prompt on its backend, then end the job as cancelled."""
        slot = running.slot
        if slot is not None:
            try:
                outcome = await slot.backend.client.cancel(str(running.job.id))
                logger.info("cancel on backend %s: %s", slot.backend.name, outcome,
                            extra={"action": "job_cancel", "job_id": str(running.job.id)})
            except comfy_errors.ComfyError as exc:
                logger.info("could not stop the job on its backend: %s", exc)
        if running.task is not None and not running.task.done():
            running.task.cancel()

    async def _renew_loop(self) -> None:
        interval = self.options.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            for running in list(self._running.values()):
                if running.settled:
                    continue
                try:
                    renewed = await self.store.renew_lease(running.job, self.options.lease_seconds)
                except store_errors.LeaseLost:
                    if running.settled:
                        continue  # the final status landed while the renewal was in flight
                    logger.warning("lease lost; dropping the job here",
                                   extra={"action": "lease_lost", "job_id": str(running.job.id)})
                    running.cancelling = True
                    if running.task is not None:
                        running.task.cancel()
                    continue
                except store_errors.StoreError as exc:
                    logger.warning("cannot renew leases: %s", exc,
                                   extra={"action": "renew_failed"})
                    break
                if renewed.cancel_requested and not running.settled:
                    self._request_cancel(running)

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
            except store_errors.StoreError as exc:
                logger.warning("LISTEN unavailable (%s); polling", exc,
                               extra={"action": "listen_failed"})
                await asyncio.sleep(self.options.poll_interval)

    async def _recover_loop(self) -> None:
        interval = self.options.recover_interval or self.options.lease_seconds / 2
        while True:
            try:
                recovered = await self.store.recover_expired()
            except store_errors.StoreError as exc:
                logger.info("cannot recover expired leases now: %s", exc)
                recovered = []
            if recovered:
                self._queue_changed()
                for job in recovered:
                    if job.status.finished:
                        await self._deliver(job, [])
            await asyncio.sleep(interval)

    # --- delivery ------------------------------------------------------------------

    async def _deliver(
        self, job: jobs.Job, outputs: Sequence[jobs.Output] | None,
        only: Sequence[sinks_mod.DeliverySink] | None = None, *, claimed: bool = False,
    ) -> None:
        """Give a finished job to the sinks (all, or `only` these); record each delivery.

        `claimed`: the completion claimed the delivery to every sink already. The delivery
        is recorded after the sink took it: a crash in between re-delivers once (the
        deliver loop of the next worker finds it), never loses it.
        """
        targets = self.sinks if only is None else tuple(only)
        if not targets or job.id in self._delivering:
            return
        self._delivering.add(job.id)
        try:
            for sink in targets:
                try:
                    # Whoever claims delivers: this worker, the one catching up on a crashed
                    # worker's results, or the bot's process for a remote worker's job.
                    if not claimed and not await self.store.claim_delivery(
                        job.id, sink.name, self.worker_id, seconds=DELIVERY_CLAIM_SECONDS
                    ):
                        continue
                    if outputs is None or (job.status is jobs.Status.SUCCEEDED and not outputs):
                        outputs = await self.store.outputs(job.id)
                    await sink.deliver(job, outputs)
                    # Recorded here only (the sink does not): after the sink returned.
                    await asyncio.shield(
                        self.store.record_delivery(job.id, sink.name, _detail(sink, job.id))
                    )
                except ComfyveilError as exc:
                    logger.warning("delivery to %s failed: %s", sink.name, exc,
                                   extra={"action": "delivery_failed", "job_id": str(job.id)})
                except Exception:
                    logger.exception("delivery to %s failed", sink.name,
                                     extra={"action": "delivery_failed", "job_id": str(job.id)})
        finally:
            self._delivering.discard(job.id)

    async def _deliver_loop(self) -> None:
        """Deliver what a crashed worker finished but never delivered."""
        if not self.sinks:
            return
        interval = max(self.options.poll_interval, 1.0)
        while True:
            for sink in self.sinks:
                try:
                    waiting = await self.store.undelivered(sink.name)
                except store_errors.StoreError:
                    break
                for job in waiting:
                    if job.finished_at is None or job.id in self._delivering:
                        continue
                    age = time.time() - job.finished_at.timestamp()
                    if age < self.options.delivery_grace:
                        continue
                    await self._deliver(job, None, only=[sink])
            await asyncio.sleep(interval)

    def _finished_elsewhere(self, job_id: uuid.UUID) -> None:
        """A job this worker is not running has ended (another worker, maybe on another
        host, ran it): deliver it now to our sinks instead of at the next catch-up."""
        if not self.sinks or job_id in self._running or job_id in self._delivering:
            return
        task = asyncio.create_task(self._deliver_by_id(job_id), name=f"deliver-{job_id}")
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _deliver_by_id(self, job_id: uuid.UUID) -> None:
        try:
            job = await self.store.get(job_id)
        except store_errors.StoreError:
            return  # the catch-up loop will find it
        if job is not None and job.status.finished:
            await self._deliver(job, None)


def _detail(sink: sinks_mod.DeliverySink, job_id: uuid.UUID) -> Mapping[str, Any] | None:
    """What a sink wants recorded with a delivery (e.g. the Telegram message ids), if it
    says (an optional `delivery_detail(job_id)` method)."""
    detail_of = getattr(sink, "delivery_detail", None)
    if detail_of is None:
        return None
    detail = detail_of(job_id)
    return detail if isinstance(detail, Mapping) else None
