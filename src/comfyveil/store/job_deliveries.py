"""After a job ended: claiming and recording its delivery to each sink (so two workers
never send one result twice), the failed tries, and deleting old finished jobs."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection, Mapping
from typing import Any

from psycopg.types.json import Jsonb

from comfyveil.store.job_reads import JobReads
from comfyveil.store.jobs import DELIVERED, Job, seconds


class JobDeliveries(JobReads):
    """Delivery and retention of finished jobs."""

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

    async def deliver_again_now(
        self, sink: str, worker_id: str, job_ids: Collection[uuid.UUID]
    ) -> list[uuid.UUID]:
        """The destination of `sink` is back: end the wait before the next try of these
        deliveries, held back by `worker_id`'s failed tries (another worker's claim, or
        one delivered meanwhile, is left alone). The ids whose wait ended, to try now."""
        if not job_ids:
            return []
        rows = await self.db.all(
            "deliver_again_now", sink=sink, worker_id=worker_id, job_ids=list(job_ids)
        )
        return [row["job_id"] for row in rows]

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
        row = await self.db.one("purge_expired", older_than=seconds(older_than))
        return (int(row["purged"]), int(row["left_over"])) if row else (0, 0)
