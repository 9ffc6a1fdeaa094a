"""Finished jobs and everything they hold disappear after the retention period."""

from __future__ import annotations

import asyncio

from comfyveil import config, retention
from comfyveil.store import api_jobs, jobs, webhooks
from comfyveil.store.database import Database
from tests.integration.test_store_jobs import new_job
from tests.web.support import new_account


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


async def _ended_api_job(db: Database, user: int, key: str) -> jobs.Job:
    """A job of the jobs API that ended (cancelled): its webhook delivery is queued."""
    job = await db.jobs.enqueue(new_job(user, idempotency_key=f"apijob:{user}:{key}"))
    await db.jobs.cancel(job.id)
    return job


async def _hooked_jobs(db: Database, webhook_id: int) -> set[str]:
    rows = await webhooks.WebhookStore(db.pool).deliveries(webhook_id)
    return {row["payload"]["data"]["id"] for row in rows}


async def test_a_jobs_webhook_deliveries_go_with_it(db: Database) -> None:
    """A delivery names its job, command and state: the purge takes it with its job, and
    one whose job was deleted otherwise (DELETE /v1/jobs); /forget takes them at once."""
    account = await new_account(db, "ida")
    hook_id, _secret = await webhooks.WebhookStore(db.pool).create(account.id, "http://h.test/")
    user = account.user_id
    old = await _ended_api_job(db, user, "old")
    new = await _ended_api_job(db, user, "new")
    deleted = await _ended_api_job(db, user, "deleted")
    assert await _hooked_jobs(db, hook_id) == {str(old.id), str(new.id), str(deleted.id)}
    assert await api_jobs.ApiJobStore(db.pool).forget_finished(
        deleted.id, user
    )  # DELETE /v1/jobs/ID
    async with db.pool.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET finished_at = now() - interval '2 days' WHERE id = %s", (old.id,)
        )

    assert await retention.purge_once(db, config.PrivacyConfig(job_retention_days=1.0)) == 1
    assert await db.jobs.get(old.id) is None and await db.jobs.get(new.id) is not None
    assert await _hooked_jobs(db, hook_id) == {str(new.id)}

    await db.users.forget(user)
    assert await _hooked_jobs(db, hook_id) == set()
