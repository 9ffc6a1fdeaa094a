"""The hot read queries use an index once history is kept, and still answer the same.

position_and_eta, command_durations and undelivered_jobs run all the time (the first for
every tracked job on every change of the queue). With finished jobs kept until the
retention purge, a plan that scans `jobs` or `deliveries` grows with the history;
benchmarks/queries_at_scale.py has the timings, these tests the plans and the answers.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from comfyveil.store import jobs
from comfyveil.store.database import Database
from tests.fixtures import plans

HISTORY = 20_000

FILL = """
INSERT INTO jobs (id, user_id, chat_id, command, workflow_hash, params, status, submitted,
                  backend, attempts, created_at, started_at, finished_at, updated_at)
SELECT gen_random_uuid(), 1000 + g %% 50, 1000 + g %% 50,
       (ARRAY['f', 'fd', 'qwen'])[1 + g %% 3], 'old', '{}'::jsonb,
       (CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'succeeded' END)::job_status,
       true, 'gpu' || (g %% 2), 1,
       now() - make_interval(secs => g * 2 + 30), now() - make_interval(secs => g * 2 + 20),
       now() - make_interval(secs => g * 2), now() - make_interval(secs => g * 2)
FROM generate_series(1, %(count)s) AS g
"""


async def _history(db: Database) -> None:
    async with db.pool.connection() as conn:
        await conn.execute(FILL, {"count": HISTORY})
        await conn.execute("INSERT INTO deliveries (job_id, sink) SELECT id, 'telegram' FROM jobs")
        await conn.execute("ANALYZE jobs")
        await conn.execute("ANALYZE deliveries")


async def _plan(db: Database, name: str, params: dict[str, Any]) -> str:
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        return await plans.plan(conn, name, params)


HOT_QUERIES: list[tuple[str, dict[str, Any] | None]] = [
    ("position_and_eta", None),  # None: the queued job's id
    ("command_durations", {"commands": ["f", "fd", "qwen"], "backend": None}),
    ("command_durations", {"commands": ["f"], "backend": "gpu1"}),
    ("undelivered_jobs", {"sink": "telegram", "limit": 100}),
    ("undelivered_jobs", {"sink": "files", "limit": 100}),
]


async def test_hot_queries_read_no_table_whole(db: Database) -> None:
    """One filled history (filling it is most of the time) for every hot query's plan."""
    await _history(db)
    queued = await db.jobs.enqueue(
        jobs.NewJob(user_id=1, chat_id=1, command="f", workflow_hash="h")
    )
    for name, params in HOT_QUERIES:
        plan = await _plan(db, name, params if params is not None else {"job_id": queued.id})
        assert "Index" in plan and "Function Scan" not in plan, (name, params, plan)
        assert "Seq Scan on jobs" not in plan, (name, params, plan)
        assert "Seq Scan on deliveries" not in plan, (name, params, plan)


async def test_durations_are_the_newest_twenty_runs_per_command_and_backend(
    db: Database,
) -> None:
    await _history(db)
    async with db.pool.connection() as conn:
        cursor = await conn.execute(
            """
            SELECT command, backend IS NOT NULL AS on_backend,
                   avg(extract(epoch FROM finished_at - started_at))::float8 AS seconds
            FROM (SELECT command, backend, finished_at, started_at,
                         row_number() OVER (PARTITION BY command ORDER BY finished_at DESC) AS n
                  FROM jobs WHERE status = 'succeeded') r
            WHERE n <= 20 GROUP BY 1, 2
            """
        )
        expected = {row["command"]: row["seconds"] for row in await cursor.fetchall()}
    # newest runs of "f" on gpu1: make them distinctly long, so a wrong filter shows
    async with db.pool.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET started_at = finished_at - interval '99 seconds' "
            "WHERE command = 'f' AND backend = 'gpu1'"
        )
    durations = await db.jobs.durations(["f", "fd", "qwen", "fd", "unknown"])
    assert set(durations) == {"f", "fd", "qwen"}
    assert durations["fd"] == pytest.approx(expected["fd"])
    assert (await db.jobs.durations(["f"], "gpu1")) == {"f": pytest.approx(99.0)}
    assert await db.jobs.durations(["f"], "gpu7") == {}


async def test_undelivered_follows_each_sink_through_the_delivery_trigger(db: Database) -> None:
    ids = []
    for n in range(4):
        job = await db.jobs.enqueue(
            jobs.NewJob(user_id=n, chat_id=n, command="f", workflow_hash="h")
        )
        claimed = await db.jobs.claim("w", lease_seconds=30)
        assert claimed is not None and claimed.id == job.id
        await db.jobs.complete(claimed)
        ids.append(job.id)
    await db.jobs.record_delivery(ids[0], "telegram")
    await db.jobs.record_delivery(ids[1], "files")
    await db.jobs.record_delivery(ids[2], "telegram")
    await db.jobs.record_delivery(ids[2], "files")
    await db.jobs.record_delivery(ids[2], "files")  # a second time changes nothing

    async def waiting(sink: str) -> list[uuid.UUID]:
        return [j.id for j in await db.jobs.undelivered(sink)]

    assert await waiting("telegram") == [ids[1], ids[3]]  # oldest first
    assert await waiting("files") == [ids[0], ids[3]]
    assert await waiting("archive") == ids
    assert len(await db.jobs.undelivered("archive", limit=3)) == 3
