"""Ending a job: writing its final status (shielded, retried while the database is away)
and delivering finished jobs to the sinks, recording each delivery, including catch-up
delivery of jobs a crashed or remote worker finished."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from comfyveil import sinks as sinks_mod
from comfyveil.errors import ComfyveilError
from comfyveil.store import errors as store_errors
from comfyveil.store import jobs
from comfyveil.worker.options import (
    CANCELLED_HERE_KEPT,
    CATCH_UP_PAGE,
    DB_RETRY_DELAY,
    DELIVERY_BACKOFF_MAX,
    DELIVERY_CLAIM_SECONDS,
    RETRY_BACKOFF_MAX,
    WAITING_BACK_KEPT,
)

if TYPE_CHECKING:
    from comfyveil.worker.running import Running

logger = logging.getLogger("comfyveil.worker")  # the name it logged under before the split

T = TypeVar("T")


class Settling:
    """The final-write and delivery part of `Worker` (which it is mixed into)."""

    async def _settle(self, running: Running, write: Callable[[], Awaitable[T]]) -> T | None:
        """Write a job's final status: shielded from cancellation, retried while the
        database is unreachable (up to ten leases: a restart takes no job from a live
        worker, see recover_expired; after that the job is left to its lease, and a
        successor re-attaches to its prompt, whose images are still there)."""
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

    async def _retry_db(self, write: Callable[[], Awaitable[T]], running: Running) -> T | None:
        deadline = time.monotonic() + self.options.lease_seconds * 10
        while True:
            try:
                return await write()
            except store_errors.LeaseLost:
                logger.warning(
                    "job was taken over before its result was saved",
                    extra={"action": "lease_lost", "job_id": str(running.job.id)},
                )
                return None
            except store_errors.DatabaseUnreachable as exc:
                if time.monotonic() > deadline:
                    logger.error(
                        "could not save a job's result: %s",
                        exc,
                        extra={"action": "job_unsaved", "job_id": str(running.job.id)},
                    )
                    return None
                await asyncio.sleep(DB_RETRY_DELAY)

    async def _write_start(self, running: Running) -> None:
        """A run that ended before its running state was written (that waits 0.2 s, and
        then a job that ends writes none) still keeps when ComfyUI started it: "running"
        and the run's time count from there in the ETA's runs and in /metrics, not from
        the claim. One more write, for such short runs only."""
        data = running.progress_next
        since = running.executing_since
        if running.start_written or since is None or not data or data.get("state") != "running":
            return
        await self.store.record_progress(
            running.job, data, executing_for=max(0.0, time.monotonic() - since)
        )
        running.start_written = True

    async def _complete(self, running: Running, outputs: list[jobs.Output]) -> jobs.Job:
        await self._write_start(running)
        return await self.store.complete(
            running.job,
            outputs,
            claim_for=[sink.name for sink in self.sinks],
            claim_seconds=DELIVERY_CLAIM_SECONDS,
            run=running.measured,
        )

    async def _fail(
        self, running: Running, message: str, *, transient: bool, refund: bool = False
    ) -> jobs.Job:
        """`refund`: the failure was not the user's doing; if the job ends here, it stops
        counting toward their daily quota."""
        job = running.job
        backoff = min(RETRY_BACKOFF_MAX, self.options.retry_backoff * 2 ** max(0, job.attempts - 1))
        if not transient:
            await self._write_start(running)  # a retry's next run starts anew
        failed = await self.store.fail(job, message, transient=transient, backoff=backoff)
        if failed.status is jobs.Status.QUEUED:
            logger.info("job will be retried", extra={"action": "job_retry", "job_id": str(job.id)})
        else:
            self._avoid.pop(job.id, None)
            if refund:
                await self.store.refund_quota(job.id)
            if failed.status is jobs.Status.CANCELLED:
                # Its user's cancel landed while the attempt failed: it ends as they asked,
                # and the NOTIFY of its end has the prompt taken back from its backend.
                logger.info(
                    "job cancelled", extra={"action": "job_cancelled", "job_id": str(job.id)}
                )
            else:
                logger.info(
                    "job failed: %s", message, extra={"action": "job_failed", "job_id": str(job.id)}
                )
            await self._deliver(failed, [])
        return failed

    async def _mark_cancelled(self, running: Running) -> jobs.Job:
        cancelled = await self.store.mark_cancelled(running.job)
        self._cancelled_here[running.job.id] = None
        while len(self._cancelled_here) > CANCELLED_HERE_KEPT:
            self._cancelled_here.pop(next(iter(self._cancelled_here)))
        logger.info(
            "job cancelled", extra={"action": "job_cancelled", "job_id": str(running.job.id)}
        )
        await self._deliver(cancelled, [])
        return cancelled

    async def _hand_back(self, running: Running) -> jobs.Job:
        released = await self.store.release(running.job)
        logger.info(
            "job handed back", extra={"action": "job_released", "job_id": str(running.job.id)}
        )
        return released

    # --- delivery ------------------------------------------------------------------

    async def _deliver(
        self,
        job: jobs.Job,
        outputs: Sequence[jobs.Output] | None,
        only: Sequence[sinks_mod.DeliverySink] | None = None,
        *,
        claimed: bool = False,
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
                if not _accepts(sink, job):
                    # Recorded, so no catch-up ever looks at it again.
                    with contextlib.suppress(store_errors.StoreError):
                        await self.store.record_delivery(
                            job.id, sink.name, outcome=jobs.SKIPPED
                        )
                    continue
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
                except store_errors.StoreError as exc:
                    logger.warning(
                        "delivery to %s not recorded: %s",
                        sink.name,
                        exc,
                        extra={"action": "delivery_failed", "job_id": str(job.id)},
                    )
                except Exception as exc:
                    await asyncio.shield(self._delivery_failed(job, sink, exc))
        finally:
            self._delivering.discard(job.id)

    async def _delivery_failed(
        self, job: jobs.Job, sink: sinks_mod.DeliverySink, exc: Exception
    ) -> None:
        """Count a failed delivery; the catch-up tries again after a growing delay, up to
        a bound (lower when the destination refused it), then it is recorded as failed."""
        refused = isinstance(exc, sinks_mod.Undeliverable)
        if isinstance(exc, ComfyveilError):
            reason = str(exc)
            logger.warning(
                "delivery to %s failed: %s",
                sink.name,
                reason,
                extra={"action": "delivery_failed", "job_id": str(job.id)},
            )
        else:
            reason = f"internal error ({type(exc).__name__})"
            logger.error(
                "delivery to %s failed",
                sink.name,
                exc_info=exc,
                extra={"action": "delivery_failed", "job_id": str(job.id)},
            )
        opts = self.options
        try:
            failures, given_up = await self.store.delivery_failed(
                job.id, sink.name, reason[:300],
                max_failures=opts.delivery_refused_tries if refused else opts.delivery_tries,
                backoff=opts.delivery_backoff, backoff_max=DELIVERY_BACKOFF_MAX,
            )
        except store_errors.StoreError:
            return  # the claim lapses and the catch-up tries again
        if isinstance(exc, sinks_mod.Unreachable) and back_of(sink) is not None:
            # Tried again as soon as the sink is back (its delay is written: ended then).
            waiting = self._waiting_back.setdefault(sink.name, {})
            waiting[job.id] = None
            while len(waiting) > WAITING_BACK_KEPT:
                del waiting[next(iter(waiting))]  # the oldest: left to the catch-up's delay
        if given_up:
            logger.warning(
                "gave up delivering to %s after %d tries: %s",
                sink.name,
                failures,
                reason,
                extra={"action": "delivery_given_up", "job_id": str(job.id)},
            )

    async def _deliver_loop(self) -> None:
        """Deliver what a crashed or remote worker finished but never delivered."""
        if not self.sinks:
            return
        interval = max(self.options.poll_interval, 1.0)
        while True:
            tried = full = False
            for sink in self.sinks:
                try:
                    waiting = await self.store.undelivered(sink.name, limit=CATCH_UP_PAGE)
                except store_errors.StoreError:
                    break
                full = full or len(waiting) >= CATCH_UP_PAGE
                for job in waiting:
                    if job.finished_at is None or job.id in self._delivering:
                        continue
                    age = time.time() - job.finished_at.timestamp()
                    if age < self.options.delivery_grace:
                        continue
                    tried = True
                    await self._deliver(job, None, only=[sink])
            if not (tried and full):  # a full page done: the next one may wait behind it
                await asyncio.sleep(interval)

    async def _deliver_when_back(self, sink: sinks_mod.DeliverySink) -> None:
        """Each time `sink`'s destination is back after an outage, try at once the
        deliveries that failed here because it was down: after an outage of an hour the
        last failed try's delay is half an hour, which no user should wait on top."""
        back = back_of(sink)
        assert back is not None
        while True:
            await back()
            waiting = self._waiting_back.pop(sink.name, {})
            ids = [job_id for job_id in waiting if job_id not in self._delivering]
            try:
                released = await self.store.deliver_again_now(sink.name, self.worker_id, ids)
            except store_errors.StoreError:
                continue  # the catch-up tries them after their delay
            for job_id in released:
                await self._deliver_by_id(job_id, only=[sink])

    def _finished_elsewhere(self, job_id: uuid.UUID) -> None:
        """A job this worker is not running has ended (another worker, maybe on another
        host, ran it): deliver it now to our sinks instead of at the next catch-up."""
        if not self.sinks or job_id in self._running or job_id in self._delivering:
            return
        task = asyncio.create_task(self._deliver_by_id(job_id), name=f"deliver-{job_id}")
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _deliver_by_id(
        self, job_id: uuid.UUID, only: Sequence[sinks_mod.DeliverySink] | None = None
    ) -> None:
        try:
            job = await self.store.get(job_id)
        except store_errors.StoreError:
            return  # the catch-up loop will find it
        if job is not None and job.status.finished:
            await self._deliver(job, None, only=only)


def _accepts(sink: sinks_mod.DeliverySink, job: jobs.Job) -> bool:
    """Whether `sink` takes `job` at all (an optional `accepts(job)` method says)."""
    accepts = getattr(sink, "accepts", None)
    return True if accepts is None else bool(accepts(job))


def back_of(sink: sinks_mod.DeliverySink) -> Callable[[], Awaitable[None]] | None:
    """A sink's optional `back()`: returns when its destination answers again after an
    outage (the deliveries that failed as `Unreachable` are then tried at once)."""
    back = getattr(sink, "back", None)
    return back if callable(back) else None


def _detail(sink: sinks_mod.DeliverySink, job_id: uuid.UUID) -> Mapping[str, Any] | None:
    """What a sink wants recorded with a delivery (e.g. the Telegram message ids), if it
    says (an optional `delivery_detail(job_id)` method)."""
    detail_of = getattr(sink, "delivery_detail", None)
    if detail_of is None:
        return None
    detail = detail_of(job_id)
    return detail if isinstance(detail, Mapping) else None
