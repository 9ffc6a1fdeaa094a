"""Finished jobs and everything they hold disappear after the retention period."""

from __future__ import annotations

import asyncio

from comfyveil import config, retention
from comfyveil.store import jobs
from comfyveil.store.database import Database
from tests.integration.test_store_jobs import new_job


async def test_the_purge_loop_removes_old_results_and_keeps_waiting_jobs(db: Database) -> None:
    done = await db.jobs.enqueue(new_job(1))
    waiting = await db.jobs.enqueue(new_job(2))
    claimed = await db.jobs.claim("w")
    assert claimed is not None and claimed.id == done.id
    await db.jobs.complete(claimed, [jobs.Output("a.png", "image", "image/png", b"pixels")])

    keep_a_day = config.PrivacyConfig(job_retention_days=1.0)
    assert await retention.purge_once(db, keep_a_day) == 0  # finished just now: kept
    assert await db.jobs.get(done.id) is not None

    keep_a_blink = config.PrivacyConfig(job_retention_days=0.05 / 86400)
    await asyncio.sleep(0.1)
    loop = asyncio.create_task(retention.purge_forever(db, keep_a_blink, interval=0.05))
    try:
        async with asyncio.timeout(5):
            while await db.jobs.get(done.id) is not None:
                await asyncio.sleep(0.05)
    finally:
        loop.cancel()
    assert await db.jobs.outputs(done.id) == []  # the image is gone with the job
    assert await db.sessions.last_outputs(1) is None  # and so is the chat's chaining ref
    assert await db.jobs.get(waiting.id) is not None  # work not yet done is never purged
