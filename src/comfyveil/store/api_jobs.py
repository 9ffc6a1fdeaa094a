"""What the jobs API reads of the queue beyond `JobStore`: an account's jobs a page at a
time (newest first, by a cursor that does not shift when new jobs arrive), a job's
history after a point (a resumed event stream), and forgetting one finished job."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from comfyveil.store import errors
from comfyveil.store.job_store import JobStore
from comfyveil.store.jobs import Job, JobEvent, Output
from comfyveil.store.pooled import PoolStore
from comfyveil.store.web_listings import OutputInfo


@dataclass(frozen=True)
class News:
    """What an event stream reads at each wake-up: the job's history after a point, the
    job as it stands after that history, and its outputs once it has succeeded."""

    events: list[JobEvent]
    job: Job | None
    outputs: list[OutputInfo]
    # the rows of query eta_state, when asked for (None: not read)
    eta: list[dict[str, Any]] | None = None


_EVENTS_AFTER = "SELECT * FROM job_events WHERE job_id = %(j)s AND id > %(a)s ORDER BY id"
_JOB = "SELECT * FROM jobs WHERE id = %(j)s"
_ONE_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
_OUTPUTS = (
    'SELECT o."index", o.filename, o.kind, o.mime, octet_length(o.data) AS size '
    'FROM job_outputs o WHERE o.job_id = %(j)s {also} ORDER BY o."index"'
)

_ALL_OUTPUTS = _OUTPUTS.format(also="")
_SUCCEEDED_OUTPUTS = _OUTPUTS.format(
    also="AND EXISTS (SELECT 1 FROM jobs j WHERE j.id = o.job_id AND j.status = 'succeeded')"
)


class ApiJobStore(PoolStore):
    async def page(
        self, user_id: int, *, limit: int, before: tuple[dt.datetime, uuid.UUID] | None = None
    ) -> list[Job]:
        """The user's jobs newest first, after the one `before` names (its created_at and
        id; None: from the newest). Read along the (user_id, created_at) index."""
        rows = await self._all(
            "SELECT * FROM jobs WHERE user_id = %(u)s "
            "AND (%(at)s::timestamptz IS NULL OR (created_at, id) < (%(at)s, %(id)s::uuid)) "
            "ORDER BY created_at DESC, id DESC LIMIT %(n)s",
            {
                "u": user_id,
                "at": before[0] if before else None,
                "id": before[1] if before else None,
                "n": limit,
            },
        )
        return [Job.from_row(r) for r in rows]

    async def news(self, job_id: uuid.UUID, after: int, *, eta: bool = False) -> News:
        """The job's history after event `after`, then the job, then its outputs if it
        has succeeded, sent in one round trip (a pipeline on one connection): a stream
        wakes up several times a job, its last wake-up on the path to the client's result,
        and each round trip costs more than its query on a busy machine. All of it is read
        as of one moment (one REPEATABLE READ snapshot): a stream ends on reading the job
        ended, so that read must hold the event that ended it, and the job is never older
        than the last event sent. Read statement by statement, a job that ended between
        the history and the job came back ended without its last event.
        `eta`: also what the job's ETA needs (`JobStore.wait`), in the same round trip."""
        params = {"j": job_id, "a": after}
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            async with conn.pipeline(), conn.transaction():
                await conn.execute(_ONE_SNAPSHOT)
                events = await conn.execute(_EVENTS_AFTER, params)
                job = await conn.execute(_JOB, params)
                # read after the job: a job read as succeeded has its outputs (written in
                # the statement that ended it), and none are read before it has
                outputs = await conn.execute(_SUCCEEDED_OUTPUTS, params)
                waits = await conn.execute(*JobStore.eta_query(job_id)) if eta else None
            found = await job.fetchone()
            return News(
                events=[JobEvent.from_row(r) for r in await events.fetchall()],
                job=Job.from_row(found) if found else None,
                outputs=[OutputInfo(**r) for r in await outputs.fetchall()],
                eta=await waits.fetchall() if waits is not None else None,
            )

    async def outputs(self, job_id: uuid.UUID) -> list[OutputInfo]:
        """What the job's outputs are, without their bytes."""
        rows = await self._all(_ALL_OUTPUTS, {"j": job_id})
        return [OutputInfo(**r) for r in rows]

    async def output(self, job_id: uuid.UUID, index: int, user_id: int) -> Output | None:
        """Output `index` of a succeeded job of the user, alone (not every output's
        bytes); None for anything else."""
        rows = await self._all(
            "SELECT o.* FROM job_outputs o JOIN jobs j ON j.id = o.job_id "
            'WHERE o.job_id = %(j)s AND o."index" = %(i)s AND j.user_id = %(u)s '
            "AND j.status = 'succeeded'",
            {"j": job_id, "i": index, "u": user_id},
        )
        return Output.from_row(rows[0]) if rows else None

    async def forget_finished(self, job_id: uuid.UUID, user_id: int) -> bool:
        """Delete one finished job of the user with its files and history; False when it
        is not theirs or has not finished."""
        rows = await self._all(
            "DELETE FROM jobs WHERE id = %(j)s AND user_id = %(u)s "
            "AND status IN ('succeeded', 'failed', 'cancelled') RETURNING id",
            {"j": job_id, "u": user_id},
        )
        return bool(rows)
