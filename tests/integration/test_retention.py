"""Finished jobs and everything they hold disappear after the retention period."""

from __future__ import annotations

import asyncio

from comfyveil import config, retention
from comfyveil.store import api_jobs, compaction, jobs, webhooks
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
    """A delivery names its job, command and state: once it was sent, the purge takes it
    with its job, and one whose job was deleted otherwise (DELETE /v1/jobs); /forget takes
    them at once."""
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
        # sent: one still due is sent before the purge takes it
        await conn.execute("UPDATE webhook_deliveries SET delivered_at = now()")

    assert await retention.purge_once(db, config.PrivacyConfig(job_retention_days=1.0)) == 1
    assert await db.jobs.get(old.id) is None and await db.jobs.get(new.id) is not None
    assert await _hooked_jobs(db, hook_id) == {str(new.id)}

    await db.users.forget(user)
    assert await _hooked_jobs(db, hook_id) == set()

# Every table that names a job: by a job_id column, an array of them, or a webhook event.
_ROWS_OF = {
    "job_events": "SELECT count(*) AS n FROM job_events WHERE job_id = ANY(%(ids)s)",
    "job_outputs": "SELECT count(*) AS n FROM job_outputs WHERE job_id = ANY(%(ids)s)",
    "deliveries": "SELECT count(*) AS n FROM deliveries WHERE job_id = ANY(%(ids)s)",
    "delivery_claims": "SELECT count(*) AS n FROM delivery_claims WHERE job_id = ANY(%(ids)s)",
    "webhook_jobs": "SELECT count(*) AS n FROM webhook_jobs WHERE job_id = ANY(%(ids)s)",
    "webhook_deliveries": "SELECT count(*) AS n FROM webhook_deliveries"
    " WHERE payload #>> '{data,id}' = ANY(%(texts)s)",
    "api_requests": "SELECT count(*) AS n FROM api_requests WHERE job_ids && %(ids)s",
}
_JOB_TABLES_BYTES = (
    "SELECT sum(pg_total_relation_size(c.oid)) AS n FROM pg_class c"
    " WHERE c.relkind = 'r' AND c.relname = ANY(%(tables)s)"
)


async def _one(db: Database, sql: str, params: dict[str, object] | None = None) -> int:
    async with db.pool.connection() as conn:
        row = await (await conn.execute(sql, params or {})).fetchone()
    assert row is not None
    return int(row["n"] or 0)


async def _finish_jobs(db: Database, count: int, *, account: int) -> list[jobs.Job]:
    """Jobs run to their end the way workers end them: events, an output, a delivery,
    a webhook event (delivered) and, for the images API, the record of the request."""
    done = []
    for index in range(count):
        queued = await db.jobs.enqueue(new_job(100))
        async with db.pool.connection() as conn:
            await conn.execute("INSERT INTO webhook_jobs (job_id) VALUES (%s)", (queued.id,))
            await conn.execute(
                "INSERT INTO api_requests (account_id, fingerprint, job_ids, clients, state)"
                " VALUES (%s, %s, %s, %s, 'open')",
                # one of two still counts a client: its process was killed as it waited
                (account, index.to_bytes(4, "big"), [queued.id], index % 2),
            )
        claimed = await db.jobs.claim("w")
        assert claimed is not None
        finished = await db.jobs.complete(
            claimed, [jobs.Output("a.png", "image", "image/png", b"p" * 3000)],
            claim_for=["telegram"], claim_seconds=30,
        )
        await db.jobs.record_delivery(claimed.id, "telegram", {"message_ids": [index]})
        done.append(finished)
    async with db.pool.connection() as conn:
        await conn.execute("UPDATE webhook_deliveries SET delivered_at = now()")
    return done


async def test_a_purge_leaves_no_row_of_its_jobs_and_gives_their_room_back(
    db: Database,
) -> None:
    async with db.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO web_accounts (id, name, name_key, passphrase, user_id, chat_id)"
            " VALUES (7, 'hook', 'hook', 'x', 100, -100)"
        )
    await webhooks.WebhookStore(db.pool).create(7, "http://127.0.0.1:9/hook")
    tables = list(compaction.JOB_TABLES)
    await _finish_jobs(db, 20, account=7)  # a warmed-up queue: a few jobs on record
    warm = await _one(db, _JOB_TABLES_BYTES, {"tables": tables})
    churned = await _finish_jobs(db, 600, account=7)
    assert await _one(db, _ROWS_OF["webhook_deliveries"], {"texts": [str(churned[0].id)]})

    await asyncio.sleep(0.1)
    assert await retention.purge_once(db, config.PrivacyConfig(job_retention_days=0.05 / 86400))

    ids = [job.id for job in churned]
    for table, sql in _ROWS_OF.items():
        left = await _one(db, sql, {"ids": ids, "texts": [str(i) for i in ids]})
        assert left == 0, f"{left} rows of purged jobs left in {table}"
    async with db.pool.connection() as conn:
        await conn.execute("VACUUM")  # what autovacuum does: no lock, no rewrite
    after = await _one(db, _JOB_TABLES_BYTES, {"tables": tables})
    assert after <= 1.1 * warm, f"job tables {warm >> 10} KiB warm, {after >> 10} KiB after"
