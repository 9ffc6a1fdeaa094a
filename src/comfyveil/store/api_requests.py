"""The images API's requests (migrations 0024, 0027): which jobs a request without an
Idempotency-Key queued, whether a client still waits for them (and which process's
client: `owner`, the key of that process's presence lock, store/presence.py), and when
the last one went (or when its owner was first seen dead). OpenAI's SDK retries a
request that timed out or lost its connection with the same body, so a retry takes over
the jobs its first try left instead of paying for new ones; jobs nobody takes over are
given up (`settle`). Only a digest of the request is kept, never its prompt.

A row is left when no client waits on it, or when the process whose client waited has
died (killed, crashed: its presence lock is gone), from that moment on: the dead
process's client is gone with it, and its SDK's retry reaches another process."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from comfyveil.store import errors, jobs
from comfyveil.store.presence import HELD_KEYS

STALE_SECONDS = 86_400.0  # a row nobody ever let go of is dropped after this
# After the database (re)starts, every process's presence lock is gone until that
# process takes it again (store/presence.py retries every 0.2 s): for these seconds no
# owner counts as dead, so a live process's waiting clients keep their rows.
SETTLE_IN = 5.0

# The row's owner (the process whose client waits) has died: it holds no presence lock.
# NULL: a row from before owners were recorded, waited for as then.
GONE = (
    "(owner IS NOT NULL "
    " AND pg_postmaster_start_time() < now() - make_interval(secs => %(settle)s) "
    f" AND owner NOT IN ({HELD_KEYS}))"
)
LEFT = f"(clients = 0 OR {GONE})"  # no client waits on the row any more


@dataclass(frozen=True)
class Taken:
    id: int
    job_ids: tuple[uuid.UUID, ...]


class ApiRequestStore:
    def __init__(self, pool: AsyncConnectionPool[Any], *, owner: int | None = None) -> None:
        self.pool = pool
        self.owner = owner  # this process's presence key, written on the rows it waits on
        self.settle_in = SETTLE_IN

    async def _all(self, query: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            cursor = await conn.execute(query, params)
            return await cursor.fetchall() if cursor.description else []

    async def take_over(self, account_id: int, fingerprint: bytes) -> Taken | None:
        """The oldest request of this account with this digest that no client waits for
        now, made this client's (None: there is none; the request queues its own jobs).
        A client whose process died waits no more. A request some client still waits
        for is never taken: two identical requests alive at once are two requests. A row
        locked by the sweep (or another retry) is waited for, not skipped: the sweep may
        be keeping it for this very retry, and a retry taking it meanwhile re-reads it
        as taken (waited on again, by a live process)."""
        rows = await self._all(
            "UPDATE api_requests SET clients = 1, left_at = NULL, attached = attached + 1, "
            "  owner = %(o)s "
            "WHERE id = (SELECT id FROM api_requests "
            "  WHERE account_id = %(a)s AND fingerprint = %(f)s "
            f"    AND state IN ('open', 'kept') AND {LEFT} "
            "  ORDER BY created_at, id LIMIT 1 FOR UPDATE) "
            "RETURNING id, job_ids",
            {"a": account_id, "f": fingerprint, "o": self.owner, "settle": self.settle_in},
        )
        if not rows:
            return None
        return Taken(rows[0]["id"], tuple(rows[0]["job_ids"]))

    async def has_abandoned(self, account_id: int) -> bool:
        """Whether this account has a request whose client went away that a retry may
        still take over (so a retry must not be refused for the jobs it holds)."""
        rows = await self._all(
            "SELECT 1 FROM api_requests WHERE account_id = %(a)s "
            f"AND state IN ('open', 'kept') AND {LEFT} LIMIT 1",
            {"a": account_id, "settle": self.settle_in},
        )
        return bool(rows)

    async def open(self, account_id: int, fingerprint: bytes, job_ids: list[uuid.UUID]) -> int:
        """Remember a request that queued `job_ids`, with its client waiting."""
        rows = await self._all(
            "INSERT INTO api_requests (account_id, fingerprint, job_ids, owner) "
            "VALUES (%(a)s, %(f)s, %(j)s, %(o)s) RETURNING id",
            {"a": account_id, "f": fingerprint, "j": job_ids, "o": self.owner},
        )
        return int(rows[0]["id"])

    async def leave(self, request_id: int, *, handed: bool) -> None:
        """The client is done: `handed` its answer (the row is forgotten: a new identical
        request is a new one), or gone without it (a retry may take the jobs over).
        Nothing, when the row is another process's now: a retry took it over while this
        process counted as dead (its presence lock lost for a moment), and its client
        waits on it."""
        mine = {"id": request_id, "o": self.owner}
        if handed:
            await self._all(
                "DELETE FROM api_requests WHERE id = %(id)s AND owner IS NOT DISTINCT FROM %(o)s",
                mine,
            )
            return
        await self._all(
            "UPDATE api_requests SET clients = greatest(clients - 1, 0), "
            "left_at = CASE WHEN clients <= 1 THEN now() ELSE left_at END "
            "WHERE id = %(id)s AND owner IS NOT DISTINCT FROM %(o)s",
            mine,
        )

    async def attached(self, request_id: int) -> int:
        """How many retries took this request over (0 once it is forgotten)."""
        rows = await self._all(
            "SELECT attached FROM api_requests WHERE id = %(id)s", {"id": request_id}
        )
        return int(rows[0]["attached"]) if rows else 0

    async def settle(self, *, grace: float, keep: float, limit: int = 100) -> list[jobs.Job]:
        """Give up what nobody came back for: a request left longer than `grace` seconds
        ago has its jobs that never reached a GPU cancelled (queued ones at once, claimed
        ones by asking their worker; the quota comes back with the cancel) and is
        forgotten; one whose jobs all reached a GPU is kept for a retry until `keep`
        seconds after it was left. A request whose owner died counts as left from when a
        sweep first saw it dead. The jobs cancelled (or asked to stop) now."""
        cancelled: list[jobs.Job] = []
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            # When each dead owner's rows were first seen so (undone for an owner back
            # with its lock: it had lost its connection, not its life). Rows another
            # sweep or a retry holds are passed by: the next round sees them.
            await conn.execute(
                "UPDATE api_requests SET left_at = CASE WHEN left_at IS NULL THEN now() END "
                "WHERE id IN (SELECT id FROM api_requests "
                "  WHERE state IN ('open', 'kept') AND clients > 0 AND owner IS NOT NULL "
                f"    AND (left_at IS NULL) = {GONE} FOR UPDATE SKIP LOCKED)",
                {"settle": self.settle_in},
            )
        async with (
            errors.wrap_exceptions(),
            self.pool.connection() as conn,
            conn.transaction(),
        ):
            due = await (
                await conn.execute(
                    "SELECT id, job_ids FROM api_requests "
                    f"WHERE state = 'open' AND {LEFT} "
                    "  AND left_at < now() - make_interval(secs => %(g)s) "
                    "ORDER BY left_at LIMIT %(n)s FOR UPDATE SKIP LOCKED",
                    {"g": grace, "n": limit, "settle": self.settle_in},
                )
            ).fetchall()
            for row in due:
                stopped = await (await conn.execute(_CANCEL, {"ids": row["job_ids"]})).fetchall()
                cancelled += [jobs.Job.from_row(r) for r in stopped]
                if stopped:
                    await conn.execute(
                        "DELETE FROM api_requests WHERE id = %(id)s", {"id": row["id"]}
                    )
                else:
                    await conn.execute(
                        "UPDATE api_requests SET state = 'kept' WHERE id = %(id)s",
                        {"id": row["id"]},
                    )
            await conn.execute(
                f"DELETE FROM api_requests WHERE (state = 'kept' AND {LEFT} "
                "  AND left_at < now() - make_interval(secs => %(k)s)) "
                "OR created_at < now() - make_interval(secs => %(s)s)",
                {"k": keep, "s": STALE_SECONDS, "settle": self.settle_in},
            )
        return cancelled


# A queued job is cancelled at once; one claimed but not yet sent to a GPU is asked to
# stop (its worker then never sends it, and ends it cancelled). One sent runs to its end.
_CANCEL = """
WITH target AS (
    SELECT id, status AS old_status FROM jobs
    WHERE id = ANY(%(ids)s)
      AND (status = 'queued' OR (status = 'running' AND NOT submitted AND NOT cancel_requested))
    FOR UPDATE
), updated AS (
    UPDATE jobs j
    SET status = CASE WHEN t.old_status = 'queued' THEN 'cancelled'::job_status
                      ELSE j.status END,
        finished_at = CASE WHEN t.old_status = 'queued' THEN now() ELSE j.finished_at END,
        cancel_requested = true,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id
    RETURNING j.*
), event AS (
    INSERT INTO job_events (job_id, kind, status, data)
    SELECT id, CASE WHEN status = 'cancelled' THEN 'cancelled' ELSE 'cancel_requested' END,
           status, jsonb_build_object('abandoned', true)
    FROM updated
), dropped AS (
    DELETE FROM job_inputs WHERE job_id IN (SELECT id FROM updated WHERE status = 'cancelled')
)
SELECT * FROM updated
"""
