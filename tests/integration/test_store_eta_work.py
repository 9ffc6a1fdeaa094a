"""The ETA the store gives (every front end shows it) counts what a job asks of the GPU:
its steps and size, learnt from finished runs timed from ComfyUI's start, and what a
running job still needs by the pace its progress showed."""

from __future__ import annotations

import pytest

from comfyveil import config
from comfyveil.store import database, eta, jobs


def asking(user: int, steps: int, side: int) -> jobs.NewJob:
    return jobs.NewJob(
        user_id=user,
        chat_id=user,
        command="f",
        workflow_hash="h" * 64,
        params={"prompt": "a red fox", "steps": steps, "width": side, "height": side},
    )


async def sql(db: database.Database, query: str, *args: object) -> None:
    async with db.pool.connection() as conn:
        await conn.execute(query, args)


async def finished_run(
    db: database.Database,
    user: int,
    steps: int,
    side: int,
    *,
    waited: float,
    ran: float,
    ago: float,
    backend: str = "gpu0",
) -> None:
    """A run of /f on `backend` that waited `waited` s in the GPU's queue, then ran `ran` s."""
    await db.jobs.enqueue(asking(user, steps, side))
    claimed = await db.jobs.claim("w")
    assert claimed is not None
    claimed = await db.jobs.mark_submitted(claimed, backend)
    await db.jobs.complete(claimed)
    await sql(
        db,
        "UPDATE jobs SET started_at = now() - make_interval(secs => %s),"
        " executing_at = now() - make_interval(secs => %s),"
        " finished_at = now() - make_interval(secs => %s) WHERE id = %s",
        ago + ran + waited,
        ago + ran,
        ago,
        claimed.id,
    )


async def three_runs(db: database.Database, *, waited: float) -> None:
    """4 steps of 512x512 in 3 s, 8 of 1024x1024 in 17 s, 4 of 512x512 in 3 s: 1 s fixed,
    2 s per step and megapixel; each first waited `waited` s in the GPU's queue."""
    await finished_run(db, 1, 4, 512, waited=waited, ran=3, ago=300)
    await finished_run(db, 2, 8, 1024, waited=waited, ran=17, ago=200)
    await finished_run(db, 3, 4, 512, waited=waited, ran=3, ago=100)


async def test_a_job_asking_for_more_steps_and_pixels_gets_a_longer_eta(
    db: database.Database,
) -> None:
    # 4 steps of 512x512 ran 3 s, 8 steps of 1024x1024 ran 17 s: 1 s fixed, 2 s per step
    # and megapixel. Each waited 30 s in the GPU's queue first: not part of a run.
    await three_runs(db, waited=30)
    big = await db.jobs.enqueue(asking(4, 8, 1024))
    wait = await db.jobs.wait(big.id, backends=["gpu0"])
    assert wait is not None and wait.seconds == pytest.approx(17.0, rel=0.05)
    small = await db.jobs.enqueue(asking(5, 2, 512))  # behind the big one on one GPU
    wait = await db.jobs.wait(small.id, backends=["gpu0"])
    assert wait is not None and wait.seconds == pytest.approx(17.0 + 2.0, rel=0.05)


async def test_a_running_job_still_needs_its_steps_left_at_its_own_pace(
    db: database.Database,
) -> None:
    await three_runs(db, waited=0)
    await db.jobs.enqueue(asking(4, 8, 1024))
    running = await db.jobs.claim("w")
    assert running is not None
    running = await db.jobs.mark_submitted(running, "gpu0")
    # ComfyUI started it 16 s ago (its estimate: 17 s); it is at step 2 of 8 at 6 s a
    # step: 6 steps left need 36 s, not the 1 s its estimate leaves.
    await db.jobs.record_progress(
        running,
        {"state": "running", "backend": "gpu0", "value": 2, "max": 8, "step_s": 6.0},
        executing_for=16.0,
    )
    wait = await db.jobs.wait(running.id, backends=["gpu0"])
    assert wait is not None and wait.seconds == pytest.approx(6 * 6.0 + 1.0, rel=0.05)


async def test_a_job_waiting_on_its_gpu_waits_only_for_the_jobs_sent_there_before_it(
    db: database.Database,
) -> None:
    await three_runs(db, waited=0)
    sent = []
    for user, steps, side in ((4, 8, 1024), (5, 4, 512), (6, 8, 1024)):
        await db.jobs.enqueue(asking(user, steps, side))
        claimed = await db.jobs.claim("w")
        assert claimed is not None
        sent.append(await db.jobs.mark_submitted(claimed, "gpu0"))
    first, mine, _after_mine = sent
    await db.jobs.record_progress(first, {"state": "running", "backend": "gpu0"}, executing_for=1.0)
    # The first has run 1 s of its 17; ours (3 s) runs next. The job sent to gpu0 after
    # ours waits behind it in ComfyUI's queue: 16 + 3 s, not 16 + 17 + 3.
    wait = await db.jobs.wait(mine.id, backends=["gpu0"])
    assert wait is not None and wait.seconds == pytest.approx(16.0 + 3.0, rel=0.05)


async def test_a_queued_job_with_jobs_behind_it_is_counted_on_the_free_gpu_the_pool_takes(
    db: database.Database,
) -> None:
    # gpu0 runs /f in 2 s and holds two jobs (1 s and 2 s left); gpu1, free, takes 10 s.
    # Alone in the queue, a job waits for gpu0 (done in 1 + 2 + 2 s); with a job queued
    # behind it, the pool sends it to the free gpu1 at once (10 s): a GPU left idle while
    # work waits costs more than it gains by waiting. The ETA must follow the pool.
    for user, backend, ran, ago in ((1, "gpu1", 10, 400), (2, "gpu0", 2, 300),
                                    (3, "gpu1", 10, 200), (4, "gpu0", 2, 100)):  # fmt: skip
        await finished_run(db, user, 4, 512, waited=0, ran=ran, ago=ago, backend=backend)
    on_gpu0 = []
    for user in (5, 6):
        await db.jobs.enqueue(asking(user, 4, 512))
        claimed = await db.jobs.claim("w")
        assert claimed is not None
        on_gpu0.append(await db.jobs.mark_submitted(claimed, "gpu0"))
    await db.jobs.record_progress(
        on_gpu0[0],
        {"state": "running", "backend": "gpu0", "value": 2, "max": 4, "step_s": 0.5},
        executing_for=1.0,
    )
    mine = await db.jobs.enqueue(asking(7, 4, 512))
    last = await db.jobs.enqueue(asking(8, 4, 512))
    followed = await db.jobs.wait(mine.id, backends=["gpu0", "gpu1"])
    assert followed is not None and followed.backend == "gpu1"
    assert followed.seconds == pytest.approx(10.0, abs=0.5)
    alone = await db.jobs.wait(last.id, backends=["gpu0", "gpu1"])  # nothing behind it
    assert alone is not None and alone.backend == "gpu0"
    assert alone.seconds == pytest.approx(1.0 + 2.0 + 2.0, abs=0.5)
    # An operator lets gpu0 hold two jobs waiting (`max_waiting = 2`): it has a free slot,
    # and the pool sends ours there at once: gpu1, where its first ETA put it, would finish
    # it twice as late. The ETA counts the slots configured, not the default two (it said
    # gpu1, 10 s, where the pool would run it on gpu0 in 5 s).
    configured = [
        config.BackendConfig(name="gpu0", url="http://127.0.0.1:1", max_waiting=2),
        config.BackendConfig(name="gpu1", url="http://127.0.0.1:2"),
    ]
    roomier = await db.jobs.wait(
        mine.id, backends=["gpu0", "gpu1"], slots=eta.slots_of(configured)
    )
    assert roomier is not None and roomier.backend == "gpu0"
    assert roomier.seconds == pytest.approx(1.0 + 2.0 + 2.0, abs=0.5)
