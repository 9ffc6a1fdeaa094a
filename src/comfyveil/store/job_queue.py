"""Putting jobs in the queue and taking them out from the front end's side: enqueue
(with the user's limits, checked in the same statement), cancel, and the chat messages a
job answers."""

from __future__ import annotations

import logging
import uuid

from psycopg.types.json import Jsonb

from comfyveil import i18n, metrics
from comfyveil.store import errors
from comfyveil.store.connector import Row
from comfyveil.store.job_reads import JobReads
from comfyveil.store.jobs import Job, NewJob, Status

logger = logging.getLogger(__name__)


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


class JobQueue(JobReads):
    """Queueing and cancelling jobs."""

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
