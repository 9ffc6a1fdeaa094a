"""The web pages' read-only listings of a user's jobs: the history, the gallery of
results, and a job's page (its outputs and kept inputs, without their bytes)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from comfyveil.store import jobs
from comfyveil.store.accounts import Row, WebRows


@dataclass(frozen=True)
class GalleryItem:
    job_id: uuid.UUID
    index: int
    command: str
    kind: str
    mime: str
    created_at: dt.datetime
    prompt: str = ""  # the job's prompt, to tell results apart


@dataclass(frozen=True)
class OutputInfo:
    index: int
    filename: str
    kind: str
    mime: str
    size: int


class WebListings(WebRows):
    """Reads of the shared jobs tables for the web pages."""

    async def history(self, user_id: int, *, limit: int, offset: int) -> list[Row]:
        return await self._all(
            "SELECT id, command, status, params->>'prompt' AS prompt, created_at, "
            "finished_at, error, progress->>'state' AS state FROM jobs WHERE user_id = %(u)s "
            "ORDER BY created_at DESC, id LIMIT %(limit)s OFFSET %(offset)s",
            {"u": user_id, "limit": limit, "offset": offset},
        )

    async def gallery(self, user_id: int, *, limit: int, offset: int) -> list[GalleryItem]:
        rows = await self._all(
            "SELECT o.job_id, o.index, j.command, o.kind, o.mime, j.created_at, "
            "left(j.params->>'prompt', 200) AS prompt "
            "FROM jobs j JOIN job_outputs o ON o.job_id = j.id "
            "WHERE j.user_id = %(u)s AND j.status = 'succeeded' "
            "ORDER BY j.created_at DESC, o.job_id, o.index LIMIT %(limit)s OFFSET %(offset)s",
            {"u": user_id, "limit": limit, "offset": offset},
        )
        return [
            GalleryItem(
                job_id=r["job_id"],
                index=r["index"],
                command=r["command"],
                kind=r["kind"],
                mime=r["mime"],
                created_at=r["created_at"],
                prompt=r["prompt"] or "",
            )
            for r in rows
        ]

    async def job_with_files(
        self, job_id: uuid.UUID
    ) -> tuple[jobs.Job, list[OutputInfo], list[tuple[int, str]]] | None:
        """A job with its outputs (without their bytes) and the (index, mime) of its kept
        input images, in one round trip: what a job's page shows."""
        row = await self._one(
            "SELECT j.*, "
            "coalesce((SELECT json_agg(json_build_array(o.index, o.filename, o.kind, o.mime, "
            "o.size) ORDER BY o.index) FROM job_outputs o WHERE o.job_id = j.id), '[]') "
            "AS output_list, "
            "coalesce((SELECT json_agg(json_build_array(i.index, i.mime) ORDER BY i.index) "
            "FROM job_inputs i WHERE i.job_id = j.id), '[]') AS input_list "
            "FROM jobs j WHERE j.id = %(id)s",
            {"id": job_id},
        )
        if row is None:
            return None
        return (
            jobs.Job.from_row(row),
            [OutputInfo(*o) for o in row["output_list"]],
            [(i, m) for i, m in row["input_list"]],
        )

    async def output_owner(self, job_id: uuid.UUID) -> int | None:
        row = await self._one("SELECT user_id FROM jobs WHERE id = %(id)s", {"id": job_id})
        return int(row["user_id"]) if row else None
