"""The worker's side of the queue: claiming a job, holding its lease, recording its
progress and how it ended, and taking back the jobs of workers that died."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from comfyveil import metrics
from comfyveil.store import errors
from comfyveil.store.connector import Session
from comfyveil.store.job_reads import JobReads
from comfyveil.store.jobs import Job, Output, Status, seconds

logger = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 30.0
# claim_job sorts this many ready jobs per waiting user; more than the claims that can race
# for one user's jobs at once with a handful of workers (an exhaustive pass covers the rest).
CLAIM_CANDIDATES_PER_USER = 4


class LeaseLine:
    """A connection of a worker's own for renewing its leases.

    The pool reconnects after an outage with growing delays (1, 2, 4, 8 s...), so it may
    come back long after the database did; meanwhile other workers, whose pools came back
    sooner, would find the leases run out. This line connects again at each try, so the
    leases are renewed as soon as the database answers.
    """

    CONNECT_TIMEOUT = 2  # seconds (libpq's smallest)

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def renew(self, job: Job, lease_seconds: float) -> Job:
        """As `JobStore.renew_lease`."""
        try:
            async with errors.wrap_exceptions():
                if self._conn is None or self._conn.closed:
                    self._conn = await psycopg.AsyncConnection.connect(
                        self.url, autocommit=True, row_factory=dict_row,
                        connect_timeout=self.CONNECT_TIMEOUT,
                    )
                row = await Session(self._conn).one(
                    "renew_lease", job_id=job.id, worker_id=job.lease_owner,
                    lease_seconds=lease_seconds,
                )
        except errors.DatabaseUnreachable:
            await self.close()
            raise
        if row is None:
            raise errors.LeaseLost()
        return Job.from_row(row)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


class JobLeases(JobReads):
    """A worker's operations on the jobs it claims."""

    async def claim(
        self,
        worker_id: str,
        *,
        backends: Iterable[str] | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> Job | None:
        """Take the next job, or None when nothing is ready.

        Order: highest priority first; among equals, the user whose last claim is oldest
        (round-robin, so one user's batch does not starve the others); then oldest job.
        Jobs still in retry backoff (`not_before`) wait.

        Args:
            backends: the backends with a free slot; only jobs that can run on one of them
                are taken. None: any job.
        """
        params = {
            "worker_id": worker_id,
            "backends": list(backends) if backends is not None else None,
            "lease_seconds": lease_seconds,
        }
        # When each user's first few ready jobs are all being claimed by racing workers,
        # the function looks at every ready job before it answers None.
        row = await self.db.one("claim_job", per_user=CLAIM_CANDIDATES_PER_USER, **params)
        if row is None:
            return None
        job = Job.from_row(row)
        logger.info("job claimed", extra={"action": "job_claimed", "job_id": str(job.id)})
        metrics.job_claimed(job)
        return job

    async def _held(self, query: str, job: Job, **params: Any) -> Job:
        row = await self.db.one(query, job_id=job.id, worker_id=job.lease_owner, **params)
        if row is None:
            raise errors.LeaseLost()
        return Job.from_row(row)

    async def renew_lease(self, job: Job, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Job:
        """Extend the lease; the returned job also shows `cancel_requested`.

        Raises:
            LeaseLost: the lease expired and the job went back to the queue or elsewhere.
        """
        return await self._held("renew_lease", job, lease_seconds=lease_seconds)

    async def mark_submitted(self, job: Job, backend: str) -> Job:
        """Record that the prompt goes to `backend` (so a successor re-attaches to it);
        written to disk before the prompt is posted.

        Raises:
            CancelRequested: a cancel was asked for first; the prompt must not be sent.
            LeaseLost: this worker no longer holds the job.
        """
        try:
            return await self._held("mark_submitted", job, backend=backend)
        except errors.LeaseLost:
            now = await self.get(job.id)
            if (
                now is not None
                and now.status is Status.RUNNING
                and now.lease_owner == job.lease_owner
                and now.cancel_requested
            ):
                raise errors.CancelRequested() from None
            raise

    async def record_progress(
        self, job: Job, data: Mapping[str, Any], *, executing_for: float | None = None
    ) -> bool:
        """Store the latest progress and notify listeners; True when a cancel was requested.

        Args:
            executing_for: seconds since ComfyUI started the job's prompt (its
                execution_start), once it did; the first one given is kept.

        Raises:
            LeaseLost: this worker no longer holds the job.
        """
        row = await self.db.one(
            "record_progress", job_id=job.id, worker_id=job.lease_owner,
            progress=Jsonb(dict(data)), executing_for=executing_for,
        )
        if row is None:
            raise errors.LeaseLost()
        return bool(row["cancel_requested"])

    async def complete(
        self, job: Job, outputs: Sequence[Output] = (), *, claim_for: Sequence[str] = (),
        claim_seconds: float = 0.0, run: Mapping[str, Any] | None = None,
    ) -> Job:
        """Mark the job succeeded, store its outputs, and make them the chat's last result.

        `claim_for` names sinks whose delivery this worker claims at the same time, for
        `claim_seconds` (as `claim_delivery` would, one statement sooner). `run`: what
        its run measured (`comfy.routing.measured`), kept with its progress for the ETA.

        Raises:
            LeaseLost: this worker no longer holds the job; nothing was stored.
        """
        refs = [
            {"index": index, "filename": o.filename, "kind": o.kind, "mime": o.mime}
            for index, o in enumerate(outputs)
        ]
        row = await self.db.one(
            "complete_job", job_id=job.id, worker_id=job.lease_owner,
            filenames=[o.filename for o in outputs], kinds=[o.kind for o in outputs],
            mimes=[o.mime for o in outputs], datas=[o.data for o in outputs], refs=Jsonb(refs),
            sinks=list(claim_for), claim_seconds=claim_seconds, run=Jsonb(dict(run or {})),
        )
        if row is None:
            raise errors.LeaseLost()
        logger.info("job succeeded", extra={"action": "job_succeeded", "job_id": str(job.id)})
        done = Job.from_row(row)
        metrics.job_ended(done)
        return done

    async def fail(
        self, job: Job, error: str, *, transient: bool, backoff: dt.timedelta | float = 0.0
    ) -> Job:
        """End an attempt with an error.

        A transient error with attempts left puts the job back in the queue, claimable
        after `backoff`, with `submitted` and `backend` kept: the prompt may still run on
        that backend, and the next attempt re-attaches to it (or withdraws it there before
        running it elsewhere). Anything else marks it failed.
        `error` is shown to the user: one plain sentence, no prompt text.
        """
        result = await self._held(
            "fail_job", job, error=error, transient=transient, backoff=seconds(backoff)
        )
        logger.info(
            "job attempt failed",
            extra={"action": "job_failed", "job_id": str(job.id), "status": str(result.status)},
        )
        metrics.job_ended(result)  # counted only when it is an end, not a retry
        return result

    async def refund_quota(self, job_id: uuid.UUID) -> bool:
        """A failed job stops counting toward its user's daily quota (the failure was not
        the user's doing); False when the job is not (or no longer) a failed one."""
        return await self.db.one("refund_quota", job_id=job_id) is not None

    async def mark_cancelled(self, job: Job) -> Job:
        """The worker stopped a running job after a cancel request."""
        cancelled = await self._held("mark_cancelled", job)
        metrics.job_ended(cancelled)
        return cancelled

    async def release(self, job: Job) -> Job:
        """Hand a running job back on a clean shutdown; the attempt does not count."""
        return await self._held("release_job", job)

    async def recover_expired(self, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> list[Job]:
        """Requeue running jobs whose lease expired (their worker died or hung).

        `submitted` and `backend` are kept so the next worker re-attaches to the prompt.
        A job out of attempts fails instead; one with a cancel request is cancelled.
        Nothing is recovered until the database server has answered for `lease_seconds`
        (the workers' lease) since it started: a lease that ran out while nobody could
        write to the database, crash recovery included, says nothing about its worker.
        """
        rows = await self.db.all("recover_expired", lease_seconds=lease_seconds)
        for row in rows:
            logger.warning(
                "job lease expired",
                extra={"action": "job_recovered", "job_id": str(row["id"])},
            )
        recovered = [Job.from_row(row) for row in rows]
        for job in recovered:
            metrics.job_ended(job)  # out of attempts or cancelled: an end; requeued: not
        return recovered

    async def requeue_own(self, worker_id: str) -> list[Job]:
        """Give back the running jobs a worker of this id held, at its start: the process
        that held them is gone, so their successor need not wait out the lease."""
        rows = await self.db.all("requeue_own", worker_id=worker_id)
        for row in rows:
            logger.info(
                "job of an earlier run of this worker taken back",
                extra={"action": "job_recovered", "job_id": str(row["id"])},
            )
        return [Job.from_row(row) for row in rows]
