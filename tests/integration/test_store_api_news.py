"""What the images API's event stream reads of a job at each wake-up (ApiJobStore.news)."""

from __future__ import annotations

import asyncio

from comfyveil.store import api_jobs, database
from tests.integration.test_store_jobs import new_job


async def test_a_job_read_as_ended_comes_with_the_event_that_ended_it(
    db: database.Database, database_url: str
) -> None:
    """The stream ends when it reads the job as ended, so that read must carry the event
    that ended it. It read the history, then the job, each as of its own moment: a job
    that ended between the two reads came back ended with its last event missing, and
    the stream closed on "running" (seen once on a loaded machine). Here the ending lands
    between the two for sure: the job's table is locked until the history has been read."""
    job = await db.jobs.enqueue(new_job(3))
    claimed = await db.jobs.claim("w1")
    assert claimed is not None and claimed.id == job.id
    known = max(e.id for e in await db.jobs.events(job.id))
    store = api_jobs.ApiJobStore(db.pool)

    finisher = await database.connect(database_url, autocommit=False)
    # pg_stat_activity is read once per transaction: the watch runs outside the finisher's
    watcher = await database.connect(database_url)
    try:
        await finisher.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        read = asyncio.create_task(store.news(job.id, known))

        async def blocked_on_the_lock() -> bool:
            cur = await watcher.execute(
                "SELECT count(*) AS n FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT * FROM jobs%'"
            )
            row = await cur.fetchone()
            return bool(row and row["n"])

        for _ in range(500):
            if await blocked_on_the_lock():
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the read never reached the job's table")
        await finisher.execute(
            "WITH ended AS (UPDATE jobs SET status = 'succeeded', finished_at = now(), "
            "updated_at = now() WHERE id = %s RETURNING id, status) "
            "INSERT INTO job_events (job_id, kind, status, data) "
            "SELECT id, 'succeeded', status, '{}'::jsonb FROM ended",
            (job.id,),
        )
        await finisher.commit()
        news = await asyncio.wait_for(read, 10)
    finally:
        await finisher.close()
        await watcher.close()

    assert news.job is not None
    kinds = [e.kind for e in news.events]
    if news.job.status.finished:
        assert "succeeded" in kinds, kinds
    else:  # read as of before the end, history and job alike; the next read has both
        assert "succeeded" not in kinds, kinds
        later = await store.news(job.id, known)
        assert later.job is not None and later.job.status.finished
        assert "succeeded" in [e.kind for e in later.events]
