"""The job queue on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from comfyveil.store import database, errors, job_store, jobs, sql
from tests.integration.test_store_eta_work import finished_run

Database = database.Database


def new_job(
    user: int = 1, *, chat: int | None = None, command: str = "f", **kw: object
) -> jobs.NewJob:
    return jobs.NewJob(
        user_id=user, chat_id=chat if chat is not None else user, command=command,
        workflow_hash="h" * 64, params={"prompt": "a red fox"}, **kw,  # type: ignore[arg-type]
    )


async def test_enqueue_returns_a_queued_job_with_its_inputs(db: Database) -> None:
    image = jobs.InputImage(filename="in.png", mime="image/png", data=b"\x89PNG fake")
    job = await db.jobs.enqueue(new_job(7, inputs=[image], priority=2))
    assert job.status is jobs.Status.QUEUED
    assert job.params == {"prompt": "a red fox"}
    assert (await db.jobs.get(job.id)) == job
    assert await db.jobs.inputs(job.id) == [image]
    assert [e.kind for e in await db.jobs.events(job.id)] == ["queued"]


async def test_same_idempotency_key_returns_the_existing_job(db: Database) -> None:
    first = await db.jobs.enqueue(new_job(1, idempotency_key="tg:1:100"))
    again = await db.jobs.enqueue(new_job(1, idempotency_key="tg:1:100"))
    assert again.id == first.id
    concurrent = await asyncio.gather(
        *(db.jobs.enqueue(new_job(2, idempotency_key="tg:2:5")) for _ in range(5))
    )
    assert len({j.id for j in concurrent}) == 1
    assert len(await db.jobs.list_for_user(2)) == 1


async def test_per_user_cap_is_refused_with_a_clear_error(db: Database) -> None:
    for _ in range(3):
        await db.jobs.enqueue(new_job(1), max_active=3)
    with pytest.raises(errors.QueueLimitReached) as caught:
        await db.jobs.enqueue(new_job(1), max_active=3)
    assert "3 jobs waiting or running" in str(caught.value)
    # another user is not affected, and finishing a job frees a slot
    await db.jobs.enqueue(new_job(2), max_active=3)
    claimed = await db.jobs.claim("w1")
    assert claimed is not None
    await db.jobs.complete(claimed)
    await db.jobs.enqueue(new_job(claimed.user_id), max_active=3)


async def test_daily_quota_and_user_override(db: Database) -> None:
    await db.jobs.enqueue(new_job(1), daily_quota=1)
    with pytest.raises(errors.DailyQuotaReached):
        await db.jobs.enqueue(new_job(1), daily_quota=1)
    await db.users.set_daily_quota(1, 2)
    await db.jobs.enqueue(new_job(1), daily_quota=1)
    assert await db.users.quota_used_today(1) == 2


async def test_concurrent_claimers_take_every_job_exactly_once(db: Database) -> None:
    created = set()
    for i in range(200):
        created.add((await db.jobs.enqueue(new_job(i % 7))).id)

    async def claimer(name: str) -> list[uuid.UUID]:
        store = job_store.JobStore(db.pool)
        taken = []
        while (job := await store.claim(name)) is not None:
            taken.append(job.id)
        return taken

    results = await asyncio.gather(*(claimer(f"w{i}") for i in range(8)))
    taken = [job_id for result in results for job_id in result]
    assert len(taken) == len(set(taken)) == 200
    assert set(taken) == created
    assert sum(1 for r in results if r) > 1  # really concurrent


async def test_round_robin_between_users(db: Database) -> None:
    batch = [await db.jobs.enqueue(new_job(1)) for _ in range(10)]
    single = await db.jobs.enqueue(new_job(2))
    assert await db.jobs.position(single.id) <= 1
    order = []
    while (job := await db.jobs.claim("w")) is not None:
        order.append(job.id)
    assert single.id in order[:2]
    assert [j for j in order if j != single.id] == [j.id for j in batch]


async def test_three_users_with_several_jobs_take_turns_in_the_whole_order(
    db: Database,
) -> None:
    """Each user in turn, the one served longest ago first; a newcomer goes next."""
    queued = {user: [await db.jobs.enqueue(new_job(user)) for _ in range(3)]
              for user in (1, 2, 3)}
    label = {j.id: f"{user}.{i}" for user, js in queued.items() for i, j in enumerate(js)}
    order = []
    for _ in range(4):
        claimed = await db.jobs.claim("w")
        assert claimed is not None
        order.append(label[claimed.id])
    late = await db.jobs.enqueue(new_job(4))  # never served: first in line now
    label[late.id] = "4.0"
    while (claimed := await db.jobs.claim("w")) is not None:
        order.append(label[claimed.id])
    assert order == ["1.0", "2.0", "3.0", "1.1", "4.0", "2.1", "3.1", "1.2", "2.2", "3.2"]


async def test_higher_priority_goes_first(db: Database) -> None:
    await db.jobs.enqueue(new_job(1))
    urgent = await db.jobs.enqueue(new_job(2, priority=5))
    claimed = await db.jobs.claim("w")
    assert claimed is not None and claimed.id == urgent.id


async def test_claim_respects_backends(db: Database) -> None:
    only_gpu1 = await db.jobs.enqueue(new_job(1, backends=("gpu1",)))
    assert await db.jobs.claim("w", backends=["gpu0"]) is None
    claimed = await db.jobs.claim("w", backends=["gpu0", "gpu1"])
    assert claimed is not None and claimed.id == only_gpu1.id


async def test_positions_move_as_jobs_are_claimed(db: Database) -> None:
    queued = [await db.jobs.enqueue(new_job(1)) for _ in range(4)]
    assert [await db.jobs.position(j.id) for j in queued] == [0, 1, 2, 3]
    await db.jobs.claim("w")
    assert await db.jobs.position(queued[0].id) is None
    assert [await db.jobs.position(j.id) for j in queued[1:]] == [0, 1, 2]


async def test_a_job_whose_cancel_came_before_its_prompt_was_sent_is_never_sent(
    db: Database,
) -> None:
    await db.jobs.enqueue(new_job(1))
    claimed = await db.jobs.claim("w")
    assert claimed is not None
    asked = await db.jobs.cancel(claimed.id)
    assert asked is not None and asked.status is jobs.Status.RUNNING  # its worker must stop
    with pytest.raises(errors.CancelRequested):
        await db.jobs.mark_submitted(claimed, "gpu0")
    again = await db.jobs.get(claimed.id)
    assert again is not None and not again.submitted and again.backend is None


async def test_no_lease_is_taken_until_the_server_has_been_up_for_a_lease(db: Database) -> None:
    job = await db.jobs.enqueue(new_job(1))
    claimed = await db.jobs.claim("w", lease_seconds=0.05)
    assert claimed is not None
    await asyncio.sleep(0.1)
    async with db.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT extract(epoch FROM now() - pg_postmaster_start_time()) AS up"
        )
        up = float((await cursor.fetchone())["up"])  # type: ignore[index]
    # Its lease ran out, but a lease longer than the server's uptime says nothing yet.
    assert await db.jobs.recover_expired(up + 60) == []
    assert [j.id for j in await db.jobs.recover_expired(0.05)] == [job.id]


async def test_a_server_slow_to_open_gives_live_workers_a_whole_lease_after_it_answers(
    db: Database,
) -> None:
    job = await db.jobs.enqueue(new_job(1))
    claimed = await db.jobs.claim("w", lease_seconds=0.05)
    assert claimed is not None
    await asyncio.sleep(0.1)
    async with db.pool.connection() as conn:
        # As after a restart whose crash recovery outlasted the lease: the postmaster
        # started long ago, but nobody has been answered since.
        await conn.execute("DELETE FROM server_starts")
    assert await db.jobs.recover_expired(0.3) == []  # its first answer
    assert await db.jobs.recover_expired(0.3) == []
    await asyncio.sleep(0.35)
    assert [j.id for j in await db.jobs.recover_expired(0.3)] == [job.id]


async def test_a_worker_restarted_under_its_id_gets_its_running_jobs_back_at_once(
    db: Database,
) -> None:
    mine = await db.jobs.enqueue(new_job(1))
    other = await db.jobs.enqueue(new_job(2))
    first = await db.jobs.claim("me", lease_seconds=600)
    second = await db.jobs.claim("someone else", lease_seconds=600)
    assert first is not None and second is not None and {first.id, second.id} == {
        mine.id, other.id}
    await db.jobs.mark_submitted(first, "gpu1")
    (back,) = await db.jobs.requeue_own("me")
    assert back.id == first.id and back.status is jobs.Status.QUEUED
    assert back.submitted and back.backend == "gpu1"  # to re-attach to its prompt
    still = await db.jobs.get(second.id)
    assert still is not None and still.status is jobs.Status.RUNNING
    assert await db.jobs.requeue_own("me") == []


async def test_expired_lease_returns_the_job_with_submitted_and_backend(db: Database) -> None:
    job = await db.jobs.enqueue(new_job(1))
    # A lease long enough that a busy machine cannot let it lapse before the first check.
    claimed = await db.jobs.claim("dying-worker", lease_seconds=1.0)
    assert claimed is not None
    await db.jobs.mark_submitted(claimed, "gpu1")
    assert await db.jobs.recover_expired(1.0) == []  # lease still valid
    await asyncio.sleep(1.1)
    recovered = await db.jobs.recover_expired(1.0)
    assert [j.id for j in recovered] == [job.id]
    assert recovered[0].status is jobs.Status.QUEUED
    assert recovered[0].submitted and recovered[0].backend == "gpu1"
    with pytest.raises(errors.LeaseLost):
        await db.jobs.complete(claimed)  # the dead worker cannot finish it any more
    again = await db.jobs.claim("next-worker")
    assert again is not None and again.id == job.id
    assert again.submitted and again.backend == "gpu1" and again.attempts == 2
    assert "lease_expired" in [e.kind for e in await db.jobs.events(job.id)]


async def test_release_does_not_count_an_attempt(db: Database) -> None:
    await db.jobs.enqueue(new_job(1))
    claimed = await db.jobs.claim("w")
    assert claimed is not None and claimed.attempts == 1
    released = await db.jobs.release(claimed)
    assert released.status is jobs.Status.QUEUED and released.attempts == 0


async def test_transient_failures_retry_with_backoff_then_fail(db: Database) -> None:
    job = await db.jobs.enqueue(new_job(1, max_attempts=2))
    claimed = await db.jobs.claim("w")
    assert claimed is not None
    await db.jobs.mark_submitted(claimed, "gpu0")
    retried = await db.jobs.fail(claimed, "the GPU server went away", transient=True, backoff=0.2)
    assert retried.status is jobs.Status.QUEUED
    # The prompt may still run on gpu0: the next attempt looks for it there first.
    assert retried.submitted and retried.backend == "gpu0"
    assert await db.jobs.claim("w") is None  # still backing off
    await asyncio.sleep(0.25)
    second = await db.jobs.claim("w")
    assert second is not None and second.id == job.id and second.attempts == 2
    failed = await db.jobs.fail(second, "the GPU server went away", transient=True, backoff=0.2)
    assert failed.status is jobs.Status.FAILED
    assert failed.error == "the GPU server went away" and failed.finished_at is not None
    kinds = [e.kind for e in await db.jobs.events(job.id)]
    assert kinds == ["queued", "claimed", "submitted", "retry_scheduled", "claimed", "failed"]


async def test_a_retried_job_is_not_sent_back_to_the_gpu_its_first_eta_named(
    db: Database,
) -> None:
    await finished_run(db, 2, 4, 512, waited=0.0, ran=3.0, ago=60.0, backend="gpu0")
    job = await db.jobs.enqueue(new_job(1, max_attempts=2))
    wait = await db.jobs.wait(job.id, backends=["gpu0", "gpu1"])
    assert wait is not None and wait.seconds is not None and wait.backend == "gpu0"
    claimed = await db.jobs.claim("w")
    assert claimed is not None and claimed.plan == "gpu0"  # the pool keeps it there
    await db.jobs.mark_submitted(claimed, "gpu0")
    retried = await db.jobs.fail(claimed, "the GPU server went away", transient=True)
    # gpu0 failed it: the next ETA names a GPU afresh, and the pool's rule decides.
    assert retried.status is jobs.Status.QUEUED and retried.plan is None


async def test_an_eta_whose_plan_cannot_be_kept_still_answers(db: Database) -> None:
    long_name = "gpu-" + "x" * 300  # past the plan column's bound
    await finished_run(db, 2, 4, 512, waited=0.0, ran=3.0, ago=60.0, backend=long_name)
    job = await db.jobs.enqueue(new_job(1))
    wait = await db.jobs.wait(job.id, backends=[long_name])
    assert wait is not None and wait.seconds is not None and wait.backend == long_name
    queued = await db.jobs.get(job.id)
    assert queued is not None and queued.plan is None  # the rule alone decides


async def test_permanent_failure_ends_at_once(db: Database) -> None:
    await db.jobs.enqueue(new_job(1))
    claimed = await db.jobs.claim("w")
    assert claimed is not None
    failed = await db.jobs.fail(claimed, "a model is missing", transient=False)
    assert failed.status is jobs.Status.FAILED and failed.attempts == 1


async def test_cancel_queued_and_running(db: Database) -> None:
    image = jobs.InputImage(filename="in.png", mime="image/png", data=b"x")
    running = await db.jobs.enqueue(new_job(1, inputs=[image]))
    queued = await db.jobs.enqueue(new_job(1))
    claimed = await db.jobs.claim("w")
    assert claimed is not None and claimed.id == running.id

    assert await db.jobs.cancel(queued.id, by_user=2) is None  # not theirs
    cancelled = await db.jobs.cancel(queued.id, by_user=1)
    assert cancelled is not None and cancelled.status is jobs.Status.CANCELLED
    assert await db.jobs.claim("w") is None

    asked = await db.jobs.cancel(running.id, by_user=1)
    assert asked is not None and asked.status is jobs.Status.RUNNING and asked.cancel_requested
    assert await db.jobs.record_progress(claimed, {"value": 3, "max": 20}) is True
    stopped = await db.jobs.mark_cancelled(claimed)
    assert stopped.status is jobs.Status.CANCELLED
    assert await db.jobs.inputs(running.id) == []  # images gone once the job ended


async def test_complete_stores_outputs_and_sets_the_chat_result(db: Database) -> None:
    job = await db.jobs.enqueue(new_job(1, chat=-100))
    claimed = await db.jobs.claim("w")
    assert claimed is not None
    outputs = [
        jobs.Output(filename="a.png", kind="image", mime="image/png", data=b"one"),
        jobs.Output(filename="b.png", kind="image", mime="image/png", data=b"two!"),
    ]
    done = await db.jobs.complete(claimed, outputs)
    assert done.status is jobs.Status.SUCCEEDED
    stored = await db.jobs.outputs(job.id)
    assert [(o.index, o.filename, o.data, o.size) for o in stored] == [
        (0, "a.png", b"one", 3), (1, "b.png", b"two!", 4)
    ]
    session = await db.sessions.last_outputs(-100)
    assert session is not None and session.job_id == job.id
    assert [o.filename for o in session.outputs] == ["a.png", "b.png"]


async def test_delivery_is_recorded_once_and_undelivered_lists_the_rest(db: Database) -> None:
    first = await db.jobs.enqueue(new_job(1))
    second = await db.jobs.enqueue(new_job(2))
    for _ in range(2):
        claimed = await db.jobs.claim("w")
        assert claimed is not None
        await db.jobs.complete(claimed)
    assert {j.id for j in await db.jobs.undelivered("telegram")} == {first.id, second.id}
    assert await db.jobs.record_delivery(first.id, "telegram", {"message_id": 5}) is True
    assert await db.jobs.record_delivery(first.id, "telegram") is False
    assert [j.id for j in await db.jobs.undelivered("telegram")] == [second.id]


async def test_a_failed_delivery_waits_out_its_delay_and_is_given_up_at_the_bound(
    db: Database,
) -> None:
    stuck = await db.jobs.enqueue(new_job(1))
    other = await db.jobs.enqueue(new_job(2))
    for _ in range(2):
        claimed = await db.jobs.claim("w")
        assert claimed is not None
        await db.jobs.complete(claimed)
    assert await db.jobs.claim_delivery(stuck.id, "telegram", "w", seconds=60)
    # Claimed: being delivered right now, so the catch-up does not list it.
    assert [j.id for j in await db.jobs.undelivered("telegram")] == [other.id]
    tries = {"max_failures": 3, "backoff": 0.2, "backoff_max": 10.0}
    assert await db.jobs.delivery_failed(stuck.id, "telegram", "chat not found", **tries) == (
        1, False)
    assert [j.id for j in await db.jobs.undelivered("telegram")] == [other.id]  # held back
    await asyncio.sleep(0.25)
    assert stuck.id in {j.id for j in await db.jobs.undelivered("telegram")}
    assert await db.jobs.claim_delivery(stuck.id, "telegram", "w2", seconds=60)
    assert await db.jobs.delivery_failed(stuck.id, "telegram", "chat not found", **tries) == (
        2, False)
    await asyncio.sleep(0.25)
    assert stuck.id not in {j.id for j in await db.jobs.undelivered("telegram")}  # doubled
    await asyncio.sleep(0.2)
    assert await db.jobs.claim_delivery(stuck.id, "telegram", "w", seconds=60)
    assert await db.jobs.delivery_failed(stuck.id, "telegram", "chat not found", **tries) == (
        3, True)
    assert await db.jobs.delivery_outcome(stuck.id, "telegram") == jobs.FAILED
    assert [j.id for j in await db.jobs.undelivered("telegram")] == [other.id]
    assert not await db.jobs.claim_delivery(stuck.id, "telegram", "w", seconds=60)
    assert await db.jobs.delivery_outcome(other.id, "telegram") is None


async def test_eta_from_measured_durations(db: Database) -> None:
    earlier = await db.jobs.enqueue(new_job(1))
    assert await db.jobs.eta(earlier.id) is None  # nothing measured yet
    claimed = await db.jobs.claim("w")
    assert claimed is not None
    await asyncio.sleep(0.2)
    await db.jobs.complete(claimed)
    waiting = [await db.jobs.enqueue(new_job(1)) for _ in range(3)]
    etas = [await db.jobs.eta(j.id) for j in waiting]
    assert all(e is not None for e in etas)
    assert etas[0] >= 0.2 and etas[0] < etas[1] < etas[2]  # type: ignore[operator]
    assert etas[2] == pytest.approx(3 * etas[0])  # type: ignore[operator]


async def test_purge_expired_deletes_old_finished_jobs_only(db: Database) -> None:
    done = await db.jobs.enqueue(new_job(1))
    waiting = await db.jobs.enqueue(new_job(2))
    claimed = await db.jobs.claim("w")
    assert claimed is not None and claimed.id == done.id
    await db.jobs.complete(claimed, [jobs.Output("a.png", "image", "image/png", b"x")])
    await db.jobs.record_delivery(done.id, "telegram")
    assert await db.jobs.purge_expired(dt.timedelta(hours=1)) == 0
    await asyncio.sleep(0.05)
    assert await db.jobs.purge_expired(0.01) == 1
    assert await db.jobs.get(done.id) is None
    assert await db.jobs.outputs(done.id) == []
    assert await db.sessions.last_outputs(1) is None
    assert await db.jobs.get(waiting.id) is not None


async def test_notify_arrives_on_enqueue_and_updates(db: Database) -> None:
    async with db.listen(keepalive=0.5) as listener:
        job = await db.jobs.enqueue(new_job(1))
        claimed = await db.jobs.claim("w")
        assert claimed is not None
        await db.jobs.record_progress(claimed, {"value": 1, "max": 4})
        seen = []
        async with asyncio.timeout(5):
            async for note in listener:
                seen.append((note.channel, note.payload.get("event"), note.payload["job_id"]))
                if note.payload.get("event") == "progress":
                    break
    job_id = str(job.id)
    assert seen == [
        (database.UPDATES_CHANNEL, "queued", job_id),
        (database.JOBS_CHANNEL, None, job_id),
        (database.UPDATES_CHANNEL, "claimed", job_id),
        (database.UPDATES_CHANNEL, "progress", job_id),
    ]


async def test_cancel_of_running_job_notifies_the_worker(db: Database) -> None:
    await db.jobs.enqueue(new_job(1))
    claimed = await db.jobs.claim("w")
    assert claimed is not None
    async with db.listen([database.UPDATES_CHANNEL], keepalive=0.5) as listener:
        await db.jobs.cancel(claimed.id, by_user=1)
        async with asyncio.timeout(5):
            note = await anext(aiter(listener))
    assert note.payload == {"job_id": str(claimed.id), "event": "cancel_requested",
                            "status": "running"}


async def test_listener_reconnects_after_losing_its_connection(db: Database) -> None:
    async with db.listen([database.JOBS_CHANNEL], keepalive=0.2) as listener:
        stream = aiter(listener)
        async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND query LIKE 'LISTEN%'"
            )
        async with asyncio.timeout(10):
            marker = await anext(stream)
            assert marker.reconnected  # told to look at the table again
            job = await db.jobs.enqueue(new_job(1))
            note = await anext(stream)
    assert note.channel == database.JOBS_CHANNEL and note.payload == {"job_id": str(job.id)}


async def test_only_one_worker_may_catch_up_on_a_delivery(db: Database) -> None:
    job = await db.jobs.enqueue(new_job(1))
    claimed = await db.jobs.claim("w")
    assert claimed is not None
    await db.jobs.complete(claimed)

    first, second = await asyncio.gather(
        db.jobs.claim_delivery(job.id, "telegram", "w1", seconds=60),
        db.jobs.claim_delivery(job.id, "telegram", "w2", seconds=60),
    )
    assert sorted([first, second]) == [False, True]
    assert await db.jobs.claim_delivery(job.id, "files", "w2", seconds=60)  # another sink

    # The claimant died: once its claim lapses another worker may deliver.
    await db.jobs.claim_delivery(job.id, "files", "w2", seconds=60)
    assert await db.jobs.claim_delivery(job.id, "slow", "w1", seconds=0.05)
    await asyncio.sleep(0.1)
    assert await db.jobs.claim_delivery(job.id, "slow", "w2", seconds=60)

    # Delivered is final.
    await db.jobs.record_delivery(job.id, "done")
    assert not await db.jobs.claim_delivery(job.id, "done", "w1", seconds=60)


async def test_completing_claims_the_delivery_for_the_workers_sinks(db: Database) -> None:
    job = await db.jobs.enqueue(new_job(1))
    claimed = await db.jobs.claim("w1")
    assert claimed is not None
    await db.jobs.complete(claimed, claim_for=["telegram"], claim_seconds=60)
    # The completing worker delivers it; a catching-up worker keeps off until the claim lapses.
    assert not await db.jobs.claim_delivery(job.id, "telegram", "w2", seconds=60)
    assert await db.jobs.claim_delivery(job.id, "files", "w2", seconds=60)  # not claimed


async def test_a_result_and_a_queued_job_wait_for_the_disk_bookkeeping_does_not(
    db: Database,
) -> None:
    """A crash of PostgreSQL itself may undo a claim or a progress note (the job runs
    again), never a queued job, a result or a delivery."""
    await db.jobs.enqueue(new_job(1))
    await db.jobs.enqueue(new_job(2))  # left queued, for claim_job to take
    job = await db.jobs.claim("w1", lease_seconds=60)
    assert job is not None
    params = {
        "worker_id": "w1", "backends": None, "lease_seconds": 60, "per_user": 4,
        "job_id": job.id, "backend": "gpu0", "progress": Jsonb({"percent": 50}),
        "executing_for": None,
        "filenames": [], "kinds": [], "mimes": [], "datas": [], "refs": Jsonb([]),
        "sinks": [], "claim_seconds": 1.0, "run": Jsonb({}), "sink": "files",
        "detail": Jsonb({}),
        "outcome": "delivered",
    }
    enqueue_params = {
        "id": uuid.uuid4(), "idempotency_key": None, "user_id": 3, "chat_id": 3,
        "command": "f", "workflow_hash": "h" * 64, "params": Jsonb({}), "backends": None,
        "max_attempts": 3, "priority": 0, "status_message_id": None, "max_active": None,
        "daily_quota": None, "cooldown": None,
    }

    async def commit_waits(query: str, values: dict[str, object]) -> bool:
        async with db.pool.connection() as conn:
            try:
                await conn.execute("BEGIN")
                cursor = await conn.execute(sql.queries[query], values)
                assert cursor.rowcount >= 1, query  # the statement did write
                setting = await (await conn.execute("SHOW synchronous_commit")).fetchone()
            finally:
                await conn.execute("ROLLBACK")
        assert setting is not None
        return setting["synchronous_commit"] != "off"

    for relaxed in ("claim_job", "renew_lease", "record_progress"):
        assert not await commit_waits(relaxed, params), relaxed
    assert await commit_waits("enqueue_job", enqueue_params)
    # mark_submitted too: an immediate stop of PostgreSQL must not forget a sent prompt.
    for durable in ("mark_submitted", "complete_job", "record_delivery"):
        assert await commit_waits(durable, params), durable


async def test_a_database_error_is_logged_by_type_and_sqlstate_never_its_text(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL quotes the refused JSON (the prompt) in its CONTEXT line; a logged
    traceback and the StoreError name the error's type and SQLSTATE only (issue 22 §8)."""
    import logging

    from comfyveil import redaction

    redaction.install()
    job = new_job(3)
    job = jobs.NewJob(**{**job.__dict__, "params": {"prompt": "my secret\x00 marmot"}})
    with pytest.raises(errors.StoreError) as caught:
        await db.jobs.enqueue(job)
    with caplog.at_level(logging.ERROR):
        try:
            raise caught.value
        except errors.StoreError:
            logging.getLogger("comfyveil.test").exception("enqueue failed")
    assert "marmot" not in caplog.text and "secret" not in caplog.text
    assert "UntranslatableCharacter: (SQLSTATE 22P05)" in caplog.text
    assert str(caught.value) == "the database refused the request (SQLSTATE 22P05)"


async def test_a_cancel_that_meets_a_failing_attempt_ends_cancelled_never_retried(
    db: Database,
) -> None:
    """The user cancelled while the attempt was meeting an error (the backend went away),
    before the worker heard: the job ends cancelled, with its quota given back, not
    failed and not queued for another try."""
    for transient in (True, False):
        job = await db.jobs.enqueue(new_job(60), daily_quota=5)
        claimed = await db.jobs.claim("w")
        assert claimed is not None and claimed.id == job.id
        await db.jobs.mark_submitted(claimed, "gpu0")
        asked = await db.jobs.cancel(job.id, by_user=60)
        assert asked is not None and asked.cancel_requested
        ended = await db.jobs.fail(claimed, "The GPU server went away.", transient=transient)
        assert ended.status is jobs.Status.CANCELLED, transient
        assert [e.kind for e in await db.jobs.events(job.id)][-1] == "cancelled"
        assert await db.jobs.refund_quota(job.id)
        assert await db.jobs.claim("w") is None
    async with db.pool.connection() as conn:
        cursor = await conn.execute("SELECT jobs_today FROM user_usage WHERE user_id = 60")
        row = await cursor.fetchone()
    assert row is not None and row["jobs_today"] == 0
