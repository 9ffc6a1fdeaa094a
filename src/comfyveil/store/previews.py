"""The latest sampler preview of jobs whose client asked for partial images (migration
0025): asked for by the API, written by the worker running the job, read by the API's
stream. Only a job with a row gets its previews written."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from comfyveil.store.pooled import PoolStore

MAX_PREVIEW = 2 * 1024 * 1024  # a preview frame larger than this is not kept


@dataclass(frozen=True)
class Preview:
    seq: int
    mime: str
    data: bytes = field(repr=False)


class PreviewStore(PoolStore):
    async def want(self, job_ids: list[uuid.UUID]) -> None:
        """Ask for the previews of these jobs."""
        await self._all(
            "INSERT INTO job_previews (job_id) SELECT unnest(%(ids)s::uuid[]) "
            "ON CONFLICT (job_id) DO NOTHING",
            {"ids": job_ids},
        )

    async def wanted(self, job_id: uuid.UUID) -> bool:
        rows = await self._all(
            "SELECT 1 AS one FROM job_previews WHERE job_id = %(id)s", {"id": job_id}
        )
        return bool(rows)

    async def save(self, job_id: uuid.UUID, mime: str, data: bytes) -> None:
        if len(data) > MAX_PREVIEW:
            return
        await self._all(
            "UPDATE job_previews SET seq = seq + 1, mime = %(m)s, data = %(d)s, "
            "updated_at = now() WHERE job_id = %(id)s",
            {"id": job_id, "m": mime, "d": data},
        )

    async def newer(self, job_id: uuid.UUID, seq: int) -> Preview | None:
        """The job's preview if it is newer than `seq`."""
        rows = await self._all(
            "SELECT seq, mime, data FROM job_previews WHERE job_id = %(id)s AND seq > %(s)s",
            {"id": job_id, "s": seq},
        )
        if not rows:
            return None
        return Preview(rows[0]["seq"], rows[0]["mime"], bytes(rows[0]["data"]))

    async def drop(self, job_ids: list[uuid.UUID]) -> None:
        """Forget the jobs' previews once their stream is over: the result supersedes them."""
        await self._all("DELETE FROM job_previews WHERE job_id = ANY(%(ids)s)", {"ids": job_ids})
