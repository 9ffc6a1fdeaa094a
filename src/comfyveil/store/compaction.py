"""Giving back the space a large purge left in the job tables.

PostgreSQL reuses the room deleted rows leave, but a plain VACUUM (what autovacuum does)
hands back to the file system only the empty pages at a table's end, and an index's
emptied pages never: after a purge that removed most of the jobs (a short retention, a
busy day past it), the job tables' indexes stay as large as they were at their fullest.
After such a purge the job tables are vacuumed and their indexes rebuilt with
``REINDEX TABLE CONCURRENTLY``, which takes no lock that stops reads or writes (unlike
VACUUM FULL). Neither runs in a transaction: the pool's connections are autocommit.
"""

from __future__ import annotations

import logging
from typing import Any

from psycopg_pool import AsyncConnectionPool

from comfyveil.store import errors

logger = logging.getLogger(__name__)

# The tables a job's rows live in (their rows go with the job's), largest churn first.
JOB_TABLES = (
    "jobs",
    "job_events",
    "deliveries",
    "delivery_claims",
    "job_outputs",
    "job_inputs",
    "job_previews",
    "chat_sessions",
    "webhook_jobs",
    "backend_traces",
)
# A purge this large, and at least half of what was there, is worth a rebuild; an hourly
# purge of a day's retention removes a twenty-fourth, whose room the next hour reuses.
MIN_PURGED = 200

# A REINDEX CONCURRENTLY cut short (the server stopped, the connection lost) leaves its
# new index behind, invalid, named <index>_ccnew (or the old one as _ccold): every write
# still pays for it. Such leftovers are dropped before the next rebuild.
_LEFTOVERS = """
SELECT quote_ident(c.relname) AS name
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE NOT i.indisvalid AND n.nspname = current_schema()
  AND c.relname ~ '_cc(new|old)[0-9]*$'
"""


def worth_it(purged: int, left: int) -> bool:
    """Whether a purge of `purged` jobs, `left` still there, calls for a compaction."""
    return purged >= MIN_PURGED and purged >= left


async def compact(pool: AsyncConnectionPool[Any]) -> None:
    """Vacuum the job tables and rebuild their indexes, without blocking their users.

    Raises:
        StoreError: the database refused or is unreachable (the purge is done anyway;
        the room is reused, only not handed back).
    """
    async with errors.wrap_exceptions(), pool.connection() as conn:
        for row in await (await conn.execute(_LEFTOVERS)).fetchall():
            await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {row['name']}")
        for table in JOB_TABLES:
            exists = await (
                await conn.execute("SELECT to_regclass(%s) IS NOT NULL AS e", (table,))
            ).fetchone()
            if not exists or not exists["e"]:
                continue
            await conn.execute(f"VACUUM {table}")
            await conn.execute(f"REINDEX TABLE CONCURRENTLY {table}")
    logger.info("job tables compacted after a large purge", extra={"action": "jobs_compacted"})
