"""Reading jobs as they are: one job, a user's or everyone's latest, the queue's length,
a job's inputs, outputs and history. The base of `job_store.JobStore`: every other part
reads jobs through it."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from comfyveil.store.connector import Connector
from comfyveil.store.jobs import InputImage, Job, JobEvent, Output, Status


class JobReads:
    """The reads of jobs, on the store's connector."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.db = Connector(pool)

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

    async def with_status_message(self, limit: int = 10_000) -> list[Job]:
        """Jobs waiting or running that have a status message, oldest first."""
        rows = await self.db.all("jobs_with_status_message", limit=limit)
        return [Job.from_row(row) for row in rows]

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
