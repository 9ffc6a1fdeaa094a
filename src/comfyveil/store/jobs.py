"""The job queue: one method per named query of `queries.sql`.

A job goes `queued -> running -> succeeded | failed | cancelled`. Workers claim with
`FOR UPDATE SKIP LOCKED` and hold a lease they renew; a running job whose lease expires
goes back to the queue with `submitted` and `backend` kept, so the next worker re-attaches
to the prompt already on the GPU instead of paying for it twice. Every state change appends
a `job_events` row, and a trigger on that table sends NOTIFY on `comfyveil_job_updates`
(and on `comfyveil_jobs` when a job becomes claimable), so nobody needs to poll.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from comfyveil import i18n, metrics
from comfyveil.comfy import routing
from comfyveil.store import errors, sql
from comfyveil.store import eta as eta_mod
from comfyveil.store.connector import Connector, Row, Session

logger = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_MAX_ATTEMPTS = 3
# claim_job sorts this many ready jobs per waiting user; more than the claims that can race
# for one user's jobs at once with a handful of workers (an exhaustive pass covers the rest).
CLAIM_CANDIDATES_PER_USER = 4
DURATION_SAMPLES = 20  # recent successful runs averaged for an ETA (see command_durations)
NO_CHAT = 0  # the chat_id of jobs queued without a chat (`comfyveil submit`)
# How a job's delivery to a sink ended (deliveries.outcome).
DELIVERED, FAILED, SKIPPED = "delivered", "failed", "skipped"


class Status(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


@dataclass(frozen=True)
class InputImage:
    """An image a user sent with a command; kept until the job ends."""

    filename: str
    mime: str
    data: bytes = field(repr=False)

    @classmethod
    def from_row(cls, row: Row) -> InputImage:
        return cls(filename=row["filename"], mime=row["mime"], data=bytes(row["data"]))


@dataclass(frozen=True)
class Output:
    """One file a job produced. `index` is its place among the job's outputs."""

    filename: str
    kind: str  # image, video, audio, ...
    mime: str
    data: bytes = field(repr=False)
    index: int = 0

    @property
    def size(self) -> int:
        return len(self.data)

    @classmethod
    def from_row(cls, row: Row) -> Output:
        return cls(
            filename=row["filename"], kind=row["kind"], mime=row["mime"],
            data=bytes(row["data"]), index=row["index"],
        )


@dataclass(frozen=True)
class NewJob:
    """What the front end asks for; `enqueue` turns it into a `Job`."""

    user_id: int
    chat_id: int
    command: str
    workflow_hash: str
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: Sequence[InputImage] = ()
    idempotency_key: str | None = None  # e.g. "tg:<chat>:<message>"; a retry returns the same job
    priority: int = 0  # higher first
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backends: tuple[str, ...] | None = None  # backends able to run it; None: any
    status_message_id: int | None = None
    id: uuid.UUID = field(default_factory=uuid.uuid4)  # also ComfyUI's prompt_id


@dataclass(frozen=True)
class Job:
    id: uuid.UUID
    idempotency_key: str | None
    user_id: int
    chat_id: int
    command: str
    workflow_hash: str
    params: dict[str, Any]
    backends: tuple[str, ...] | None
    status: Status
    submitted: bool
    backend: str | None
    attempts: int
    max_attempts: int
    priority: int
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    not_before: dt.datetime | None
    cancel_requested: bool
    error: str | None
    status_message_id: int | None
    progress: dict[str, Any]
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime
    request_message_id: int | None = None  # the chat message that asked for it
    requested_by: str | None = None  # who asked, in groups (a display name)
    executing_at: dt.datetime | None = None  # when ComfyUI started its prompt

    @classmethod
    def from_row(cls, row: Row) -> Job:
        backends = row["backends"]
        return cls(
            id=row["id"],
            idempotency_key=row["idempotency_key"],
            user_id=row["user_id"],
            chat_id=row["chat_id"],
            command=row["command"],
            workflow_hash=row["workflow_hash"],
            params=row["params"],
            backends=tuple(backends) if backends is not None else None,
            status=Status(row["status"]),
            submitted=row["submitted"],
            backend=row["backend"],
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            priority=row["priority"],
            lease_owner=row["lease_owner"],
            lease_expires_at=row["lease_expires_at"],
            not_before=row["not_before"],
            cancel_requested=row["cancel_requested"],
            error=row["error"],
            status_message_id=row["status_message_id"],
            progress=row["progress"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            updated_at=row["updated_at"],
            request_message_id=row.get("request_message_id"),
            requested_by=row.get("requested_by"),
            executing_at=row.get("executing_at"),
        )


@dataclass(frozen=True)
class JobEvent:
    id: int
    job_id: uuid.UUID
    at: dt.datetime
    kind: str  # queued, claimed, submitted, succeeded, retry_scheduled, failed, ...
    status: Status
    data: dict[str, Any]

    @classmethod
    def from_row(cls, row: Row) -> JobEvent:
        return cls(
            id=row["id"], job_id=row["job_id"], at=row["at"], kind=row["kind"],
            status=Status(row["status"]), data=row["data"],
        )


def _seconds(value: dt.timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def _queued(row: Row | None) -> Row:
    """The row `enqueue_job` (or `user_refusal`) returned, or the refusal it carries as an
    exception."""
    if row is None or row["refusal"] == "retry":
        raise errors.StoreError(i18n.gettext("the job could not be queued; try again"))
    if row["refusal"] == "queue_limit":
        raise errors.QueueLimitReached(row["refusal_limit"])
    if row["refusal"] == "daily_quota":
        raise errors.DailyQuotaReached(row["refusal_limit"])
    if row["refusal"] == "cooldown":
        raise errors.CoolingDown(row["refusal_limit"])
    return row


ETA_RUNS = routing.RECENT  # recent runs of each command the ETA learns from: as the pool


def _number(value: Any) -> float | None:
    """A number from a progress or parameter field (JSON), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number > 0 else None


def _queued_eta(row: Row, parallel: int) -> float | None:
    """The ETA of a queued job from a `position_and_eta` row: the queue ahead shared out
    over `parallel` runners, plus its own run; None without measured runs of its command.
    A command ahead without measured runs counts as long as the job's own."""
    own = row["own_seconds"]
    if own is None:
        return None
    waiting = float(row["waiting_seconds"] or 0.0)
    return waiting / max(parallel, 1) + float(own)


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


class JobStore:
    """Every database operation on jobs."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.db = Connector(pool)

    # -- creating ----------------------------------------------------------------------

    async def enqueue(
        self, new: NewJob, *, max_active: int | None = None, daily_quota: int | None = None,
        cooldown: float | None = None,
    ) -> Job:
        """Queue a job; with an idempotency key already used, the existing job.

        The limits are checked and the job recorded in one statement, under a lock per
        user, so concurrent requests of one user cannot slip past them.

        Args:
            new: the job to create.
            max_active: refuse when the user already has this many jobs queued or running.
            daily_quota: refuse when the user queued this many jobs today (UTC), forgotten
                ones included; a per-user override in `users.daily_quota` wins.
            cooldown: refuse when the user's last job was queued less than this many
                seconds ago.

        Raises:
            QueueLimitReached, DailyQuotaReached, CoolingDown: the user must wait.
        """
        params = {
            "id": new.id, "idempotency_key": new.idempotency_key, "user_id": new.user_id,
            "chat_id": new.chat_id, "command": new.command, "workflow_hash": new.workflow_hash,
            "params": Jsonb(dict(new.params)),
            "backends": list(new.backends) if new.backends is not None else None,
            "max_attempts": new.max_attempts, "priority": new.priority,
            "status_message_id": new.status_message_id, "max_active": max_active,
            "daily_quota": daily_quota, "cooldown": cooldown,
        }
        if not new.inputs:  # one statement: no transaction to open and commit around it
            row = _queued(await self.db.one("enqueue_job", **params))
        else:
            async with self.db.session(transaction=True) as s:
                row = _queued(await s.one("enqueue_job", **params))
                if row["created"]:
                    for index, image in enumerate(new.inputs):
                        await s.run(
                            "insert_job_input", job_id=new.id, index=index,
                            filename=image.filename, mime=image.mime, data=image.data,
                        )
        if not row["created"]:
            return Job.from_row(row)  # its idempotency key was used before
        logger.info("job queued", extra={"action": "job_queued", "job_id": str(new.id)})
        return Job.from_row(row)

    async def check_limits(
        self, user_id: int, *, max_active: int | None = None, daily_quota: int | None = None,
        cooldown: float | None = None,
    ) -> None:
        """Refuse now what `enqueue` would refuse, without queueing anything: the front
        end asks before it downloads and decodes a user's image.

        Raises:
            QueueLimitReached, DailyQuotaReached, CoolingDown: the user must wait.
        """
        _queued(await self.db.one(
            "user_refusal", user_id=user_id, max_active=max_active, daily_quota=daily_quota,
            cooldown=cooldown,
        ))

    # -- the worker's side -------------------------------------------------------------

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
        claim_seconds: float = 0.0,
    ) -> Job:
        """Mark the job succeeded, store its outputs, and make them the chat's last result.

        `claim_for` names sinks whose delivery this worker claims at the same time, for
        `claim_seconds` (as `claim_delivery` would, one statement sooner).

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
            sinks=list(claim_for), claim_seconds=claim_seconds,
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
            "fail_job", job, error=error, transient=transient, backoff=_seconds(backoff)
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

    # -- the front end's side ----------------------------------------------------------

    async def cancel(self, job_id: uuid.UUID, by_user: int | None = None) -> Job | None:
        """Cancel a job: a queued one at once, a running one by asking its worker.

        Args:
            by_user: only a job of this user (None: any job, for admins).

        Returns:
            The job as it is now (unchanged if it had already ended), or None when there is
            no such job of this user.
        """
        row = await self.db.one("cancel_job", job_id=job_id, user_id=by_user)
        if row is not None:
            job = Job.from_row(row)
            if job.status is Status.CANCELLED:  # it was queued; a running one ends later
                metrics.job_ended(job)
            return job
        job = await self.get(job_id)
        if job is None or (by_user is not None and job.user_id != by_user):
            return None
        return job

    async def key_used(self, key: str, user_id: int) -> bool:
        """Whether `user_id` queued a job with idempotency key `key` (a retried request,
        which `enqueue` answers with that job whatever the limits say now)."""
        return await self.db.one("key_used", key=key, user_id=user_id) is not None

    async def get(self, job_id: uuid.UUID) -> Job | None:
        row = await self.db.one("get_job", job_id=job_id)
        return Job.from_row(row) if row else None

    async def find_by_prefix(self, prefix: str, *, limit: int = 2) -> list[Job]:
        """Jobs whose id starts with `prefix` (hex digits, dashes left out: the short id
        the chat shows), newest first. Read as a range of the primary key, not a scan."""
        digits = prefix.replace("-", "").lower()
        if not digits or len(digits) > 32 or any(c not in "0123456789abcdef" for c in digits):
            return []
        low = uuid.UUID(digits.ljust(32, "0"))
        high = uuid.UUID(digits.ljust(32, "f"))
        rows = await self.db.all("find_jobs_by_id_range", low=low, high=high, limit=limit)
        return [Job.from_row(row) for row in rows]

    async def list_for_user(
        self, user_id: int, *, limit: int = 10, statuses: Iterable[Status] | None = None,
        chat_id: int | None = None,
    ) -> list[Job]:
        """A user's most recent jobs, newest first; with `chat_id`, only those asked for in
        that chat (what a group may see of a member's jobs)."""
        rows = await self.db.all(
            "list_user_jobs", user_id=user_id, limit=limit, chat_id=chat_id,
            statuses=[str(s) for s in statuses] if statuses is not None else None,
        )
        return [Job.from_row(row) for row in rows]

    async def list_recent(
        self, *, limit: int = 20, statuses: Iterable[Status] | None = None
    ) -> list[Job]:
        """Everyone's most recent jobs, newest first."""
        rows = await self.db.all(
            "list_recent_jobs", limit=limit,
            statuses=[str(s) for s in statuses] if statuses is not None else None,
        )
        return [Job.from_row(row) for row in rows]

    async def queue_length(self) -> int:
        """Jobs waiting in the queue."""
        row = await self.db.one("queue_length")
        return int(row["queued"]) if row else 0

    async def set_status_message(
        self, job_id: uuid.UUID, message_id: int, *, request_message_id: int | None = None,
        requested_by: str | None = None,
    ) -> Job:
        """Record the job's status message, and the chat message that asked for the job and
        who (in groups), so its result answers that message wherever it is delivered."""
        row = await self.db.one(
            "set_status_message", job_id=job_id, message_id=message_id,
            request_message_id=request_message_id, requested_by=requested_by,
        )
        if row is None:
            raise errors.JobNotFound()
        return Job.from_row(row)

    async def set_request(
        self, job_id: uuid.UUID, request_message_id: int, *, requested_by: str | None = None
    ) -> None:
        """Record the chat message that asked for the job (and who, in groups)."""
        await self.db.run(
            "set_job_request", job_id=job_id, request_message_id=request_message_id,
            requested_by=requested_by,
        )

    async def running_remaining(self) -> float:
        """Seconds the running jobs still need, by measured runs of their commands (on
        their own backends where measured); what a queued job waits for beyond the queue."""
        row = await self.db.one("running_remaining")
        return float(row["seconds"]) if row is not None else 0.0

    async def with_status_message(self, limit: int = 10_000) -> list[Job]:
        """Jobs waiting or running that have a status message, oldest first."""
        rows = await self.db.all("jobs_with_status_message", limit=limit)
        return [Job.from_row(row) for row in rows]

    async def position(self, job_id: uuid.UUID) -> int | None:
        """How many queued jobs will be claimed before this one (0: next); None if not queued."""
        row = await self.db.one("position_and_eta", job_id=job_id)
        return int(row["ahead"]) if row is not None and row["queued"] else None

    async def durations(
        self, commands: Iterable[str], backend: str | None = None
    ) -> dict[str, float]:
        """Mean seconds of recent successful runs per command (on `backend`, or any)."""
        rows = await self.db.all("command_durations", commands=list(commands), backend=backend)
        return {row["command"]: row["seconds"] for row in rows}

    async def eta(self, job_id: uuid.UUID, *, parallel: int = 1) -> float | None:
        """Seconds until the job should be done, from measured durations; None if unknown.

        Args:
            parallel: how many jobs run at once (free GPUs), to share out the queue ahead.
        """
        job = await self.get(job_id)
        if job is None or job.status.finished:
            return None
        if job.status is Status.RUNNING:
            own = await self.durations([job.command], job.backend)
            if job.command not in own:
                own = await self.durations([job.command])
            if job.command not in own:
                return None
            started = job.started_at or job.updated_at
            elapsed = (dt.datetime.now(dt.UTC) - started).total_seconds()
            return max(own[job.command] - elapsed, 0.0)
        row = await self.db.one("position_and_eta", job_id=job_id)
        if row is None or not row["queued"]:  # claimed meanwhile
            return await self.eta(job_id, parallel=parallel)
        return _queued_eta(row, parallel)

    async def wait(
        self,
        job_id: uuid.UUID,
        *,
        backends: Sequence[str] | None = None,
        read: list[Row] | None = None,
    ) -> eta_mod.Wait | None:
        """What the user of a queued or running job waits for (store/eta.py): the one ETA
        every front end shows. None when the job is not there or has ended.

        Args:
            backends: the backends that can take jobs now (a GPU down is left out);
                None: those that ran recently, and those with jobs now.
            read: the rows of query eta_state (`eta_query`) when the caller read them
                with its own reads of the job, in one round trip; None: read here.
        """
        if read is None:
            row = await self.db.one("eta_state", job_id=job_id, runs=ETA_RUNS)
        else:
            row = read[0] if read else None
        if row is None or row["status"] not in (Status.QUEUED.value, Status.RUNNING.value):
            return None
        ahead: list[eta_mod.Ahead] = []
        busy: list[eta_mod.Busy] = []
        for command, allowed, backend, elapsed, state, size, done, steps, step_s in row["busy"]:
            work = eta_mod.work_of(size)
            if backend is None or state == "waiting":  # claimed, waiting for a GPU: ahead
                if row["queued"]:
                    ahead.append(
                        eta_mod.Ahead(command, tuple(allowed) if allowed else None, work)
                    )
                continue
            busy.append(
                eta_mod.Busy(
                    backend, command, elapsed, work,
                    _count(steps) or eta_mod.steps_of(size), _number(done), _number(step_s),
                )
            )
        ahead += [
            eta_mod.Ahead(command, tuple(allowed) if allowed else None, eta_mod.work_of(size))
            for command, allowed, size in row["ahead"]
        ]
        runs = eta_mod.runs_from(
            (b, c, start, end, eta_mod.work_of(size), _count(steps) or eta_mod.steps_of(size),
             _number(step_s))
            for b, c, start, end, size, steps, step_s in row["runs"]
        )
        last = {run.backend: run.command for run in runs}
        names = list(backends) if backends is not None else list(dict.fromkeys(last))
        on = elapsed = None
        if not row["queued"] and row["status"] == Status.RUNNING.value and row["backend"]:
            on = row["backend"]
            # Only a job ComfyUI has started runs there; one just claimed (no state yet),
            # waiting for the GPU, sent ("submitted": ComfyUI may queue it behind the
            # job running there) or queued on the backend waits behind that job.
            if row["state"] == "running":
                elapsed = max(0.0, float(row["elapsed"] or 0.0))
        size = row["size"]
        found = eta_mod.estimate(
            eta_mod.estimator_from(runs),
            command=row["command"],
            backends=names,
            busy=busy,
            ahead=ahead,
            own_backends=tuple(row["backends"]) if row["backends"] else None,
            on=on,
            elapsed=elapsed,
            last_command=last,
            work=eta_mod.work_of(size),
            steps=_count(row["steps"]) or eta_mod.steps_of(size),
            done=_number(row["done"]) if elapsed is not None else None,
            step_s=_number(row["step_s"]) if elapsed is not None else None,
        )
        if not row["queued"]:  # only queued jobs have a place in the queue
            return eta_mod.Wait(found.seconds, 0, found.running, {}, found.backend)
        return eta_mod.Wait(
            found.seconds,
            int(row["ahead_count"]) + (len(ahead) - len(row["ahead"])),
            found.running,
            found.ahead_by_backend,
            found.backend,
            queued=True,
        )

    @staticmethod
    def eta_query(job_id: uuid.UUID) -> tuple[LiteralString, dict[str, Any]]:
        """Query eta_state and its values, for a caller that sends it with other reads
        (then hands its rows to `wait`)."""
        return sql.queries["eta_state"], {"job_id": job_id, "runs": ETA_RUNS}

    async def position_and_eta(
        self, job_id: uuid.UUID, *, parallel: int = 1
    ) -> tuple[int | None, float | None]:
        """`position` and `eta` of a queued job from one query (the queue is read once).

        A job no longer queued (claimed or ended meanwhile) has no position, and the ETA
        `eta` gives for it now.
        """
        row = await self.db.one("position_and_eta", job_id=job_id)
        if row is None or not row["queued"]:
            return None, await self.eta(job_id, parallel=parallel)
        return int(row["ahead"]), _queued_eta(row, parallel)

    async def for_delivery(self, job_id: uuid.UUID) -> tuple[Job, dict[str, Any]] | None:
        """A job as it is now with its user's settings ({} without a user row), in one
        query; None when there is no such job (its user was forgotten)."""
        row = await self.db.one("job_for_delivery", job_id=job_id)
        if row is None:
            return None
        return Job.from_row(row), dict(row["user_settings"] or {})

    async def inputs(self, job_id: uuid.UUID) -> list[InputImage]:
        return [InputImage.from_row(r) for r in await self.db.all("job_inputs", job_id=job_id)]

    async def outputs(self, job_id: uuid.UUID) -> list[Output]:
        return [Output.from_row(r) for r in await self.db.all("job_outputs", job_id=job_id)]

    async def events(self, job_id: uuid.UUID) -> list[JobEvent]:
        return [JobEvent.from_row(r) for r in await self.db.all("job_events", job_id=job_id)]

    # -- delivery and retention --------------------------------------------------------

    async def claim_delivery(
        self, job_id: uuid.UUID, sink: str, worker_id: str, *, seconds: float
    ) -> bool:
        """Take the right to (re-)deliver a finished job to `sink` for `seconds`.

        False when it was delivered already or another worker holds a live claim, so two
        workers catching up on a crashed one's results never both send the same one.
        """
        row = await self.db.one(
            "claim_delivery", job_id=job_id, sink=sink, worker_id=worker_id, seconds=seconds
        )
        return row is not None

    async def record_delivery(
        self, job_id: uuid.UUID, sink: str, detail: Mapping[str, Any] | None = None,
        *, outcome: str = DELIVERED,
    ) -> bool:
        """Note that the job's result reached `sink` (or, with `outcome` SKIPPED, that the
        sink does not take it); True the first time only.

        Call it before sending when "at most once" matters more than "at least once",
        after sending otherwise (a crash in between then re-sends once).
        """
        row = await self.db.one(
            "record_delivery", job_id=job_id, sink=sink, detail=Jsonb(dict(detail or {})),
            outcome=outcome,
        )
        return row is not None

    async def delivery_failed(
        self, job_id: uuid.UUID, sink: str, error: str, *, max_failures: int,
        backoff: float, backoff_max: float,
    ) -> tuple[int, bool]:
        """Count a failed try to deliver to `sink` (the caller holds its claim).

        The next try waits `backoff` seconds, doubled for each earlier failure (at most
        `backoff_max`); the catch-up skips the job meanwhile. At `max_failures` failures
        the delivery is recorded as FAILED and never tried again.

        Returns:
            (failures so far, whether it was given up now); (0, False) without a claim.
        """
        row = await self.db.one(
            "delivery_failed", job_id=job_id, sink=sink, error=error,
            max_failures=max_failures, backoff=backoff, backoff_max=backoff_max,
        )
        if row is None:
            return 0, False
        return int(row["failures"]), bool(row["given_up"])

    async def delivery_outcome(self, job_id: uuid.UUID, sink: str) -> str | None:
        """DELIVERED, FAILED or SKIPPED once the delivery to `sink` ended; None before."""
        row = await self.db.one("delivery_outcome", job_id=job_id, sink=sink)
        return str(row["outcome"]) if row is not None else None

    async def undelivered(self, sink: str, *, limit: int = 100) -> list[Job]:
        """Finished jobs with no delivery recorded for `sink`, oldest first; a job being
        delivered now, or waiting to be tried again after a failure, is left out."""
        rows = await self.db.all("undelivered_jobs", sink=sink, limit=limit)
        return [Job.from_row(row) for row in rows]

    async def purge_expired(self, older_than: dt.timedelta | float) -> int:
        """Delete jobs finished longer ago than `older_than` (seconds or a timedelta)."""
        return (await self.purge(older_than))[0]

    async def purge(self, older_than: dt.timedelta | float) -> tuple[int, int]:
        """Delete jobs finished longer ago than `older_than`; (deleted, still there)."""
        row = await self.db.one("purge_expired", older_than=_seconds(older_than))
        return (int(row["purged"]), int(row["left_over"])) if row else (0, 0)
