"""The sweep of requests whose client went away, at the store: what has not reached a GPU
is stopped (queued: cancelled with its quota back; claimed but not yet sent: asked to
stop, so its worker never sends it), what has reached one is kept for a retry, and a
request a client still waits for is never touched."""

from __future__ import annotations

from comfyveil.store import accounts, api_requests, database, jobs, web_tables

WORKER = "worker-test"


async def account(db: database.Database, name: str) -> accounts.Account:
    store = web_tables.WebStore(db.pool)
    token = await store.create_invite(is_admin=False, hours=1)
    return await store.sign_up(token, name, "x" * 20)


def new_job(user_id: int) -> jobs.NewJob:
    return jobs.NewJob(
        user_id=user_id,
        chat_id=user_id,
        command="f",
        workflow_hash="h" * 64,
        params={"prompt": "a fox"},
    )


async def used_today(db: database.Database, user_id: int) -> int:
    async with db.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT coalesce(sum(jobs_today), 0) AS n FROM user_usage WHERE user_id = %(u)s",
            {"u": user_id},
        )
        row = await cursor.fetchone()
    return int(row["n"])


async def test_the_sweep_stops_what_never_reached_a_gpu_and_keeps_what_did(
    db: database.Database,
) -> None:
    owner = await account(db, "wes")
    requests = api_requests.ApiRequestStore(db.pool)
    claimed_job = await db.jobs.enqueue(new_job(owner.user_id), daily_quota=10)
    sent_job = await db.jobs.enqueue(new_job(owner.user_id), daily_quota=10)
    claims = [await db.jobs.claim(WORKER) for _ in range(2)]
    by_id = {c.id: c for c in claims if c is not None}
    assert set(by_id) == {claimed_job.id, sent_job.id}
    queued = await db.jobs.enqueue(new_job(owner.user_id), daily_quota=10)
    waited_job = await db.jobs.enqueue(new_job(owner.user_id), daily_quota=10)
    assert await used_today(db, owner.user_id) == 4
    await db.jobs.mark_submitted(by_id[sent_job.id], "gpu0")  # on the GPU

    rows = {}
    for name, job in (
        ("queued", queued),
        ("claimed", claimed_job),
        ("sent", sent_job),
        ("waited", waited_job),
    ):
        rows[name] = await requests.open(owner.id, name.encode(), [job.id])
    for name in ("queued", "claimed", "sent"):  # their clients went away
        await requests.leave(rows[name], handed=False)

    stopped = await requests.settle(grace=0.0, keep=300.0)
    assert {j.id for j in stopped} == {queued.id, claimed_job.id}
    now = {j: await db.jobs.get(j) for j in (queued.id, claimed_job.id, sent_job.id)}
    assert now[queued.id].status is jobs.Status.CANCELLED
    assert now[claimed_job.id].status is jobs.Status.RUNNING
    assert now[claimed_job.id].cancel_requested  # its worker withdraws it before sending
    assert not now[sent_job.id].cancel_requested  # on the GPU: it finishes
    assert await used_today(db, owner.user_id) == 3  # the cancelled one's quota is back

    # the request whose job is on a GPU is kept for a retry; the given-up ones are gone;
    # the one a client waits for is no retry's to take
    assert await requests.take_over(owner.id, b"queued") is None
    assert await requests.take_over(owner.id, b"claimed") is None
    taken = await requests.take_over(owner.id, b"sent")
    assert taken is not None and taken.job_ids == (sent_job.id,)
    assert await requests.take_over(owner.id, b"waited") is None
    assert await requests.attached(taken.id) == 1
