"""What jobs left on GPU hosts (history entries, files), written down until removed.

A worker writes a job's traces down before it leaves them on a backend, and strikes them
out once the backend no longer has them. Whatever a crash, a dead backend or a cancel
left behind is removed later by `comfyveil.retention`'s sweep, and `/forget` removes a
user's at once; a trace outlives its job's row for that reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from comfyveil.comfy.notrace import Trace
from comfyveil.store.connector import Connector, Row


@dataclass(frozen=True)
class StoredTrace:
    job_id: uuid.UUID
    user_id: int | None
    backend: str
    trace: Trace

    @classmethod
    def from_row(cls, row: Row) -> StoredTrace:
        return cls(
            job_id=row["job_id"],
            user_id=row["user_id"],
            backend=row["backend"],
            trace=Trace(row["kind"], row["name"], row["folder"], row["subfolder"]),
        )


def _columns(traces: Sequence[Trace]) -> dict[str, list[str]]:
    return {
        "kinds": [t.kind for t in traces],
        "names": [t.name for t in traces],
        "folders": [t.folder for t in traces],
        "subfolders": [t.subfolder for t in traces],
    }


class TraceStore:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.db = Connector(pool)

    async def record(self, job_id: uuid.UUID, backend: str, traces: Sequence[Trace]) -> None:
        """Write traces down (the job's user with them); one that is already there stays."""
        if traces:
            await self.db.run("record_traces", job_id=job_id, backend=backend, **_columns(traces))

    async def drop(self, backend: str, traces: Sequence[Trace]) -> None:
        if traces:
            await self.db.run("drop_traces", backend=backend, **_columns(traces))

    async def of_job(self, job_id: uuid.UUID, backend: str) -> list[Trace]:
        rows = await self.db.all("job_traces", job_id=job_id, backend=backend)
        return [StoredTrace.from_row(r).trace for r in rows]

    async def settled(self, *, user_id: int | None = None, limit: int = 500) -> list[StoredTrace]:
        """Traces of jobs that run nowhere any more (ended or deleted); with `user_id`,
        all of that user's, running jobs' too."""
        rows = await self.db.all("settled_traces", user_id=user_id, limit=limit)
        return [StoredTrace.from_row(r) for r in rows]

    async def disown(self, user_id: int) -> int:
        """Unlink a forgotten user's traces from them; the sweep still removes them."""
        return await self.db.run("disown_traces", user_id=user_id)


class JobTraces:
    """One job's `comfy.notrace.TraceLog`, kept in this store."""

    def __init__(self, store: TraceStore, job_id: uuid.UUID) -> None:
        self.store = store
        self.job_id = job_id

    async def left(self, backend: str, traces: Sequence[Trace]) -> None:
        await self.store.record(self.job_id, backend, traces)

    async def gone(self, backend: str, traces: Sequence[Trace]) -> None:
        await self.store.drop(backend, traces)
