"""Waiting for a job's end, as every answer of the images API does: woken by the store's
notifications, reading the job only when its news does not tell enough, and still
finding the end when the news is lost."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from comfyveil.api import waiter as waiter_mod
from comfyveil.store import database, jobs

WORKER = "worker-test"


def new_job() -> jobs.NewJob:
    return jobs.NewJob(
        user_id=1, chat_id=1, command="f", workflow_hash="h" * 64, params={"prompt": "a fox"}
    )


def count_reads(db: database.Database, monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    reads: list[uuid.UUID] = []
    get = db.jobs.get

    async def counted(job_id: uuid.UUID) -> jobs.Job | None:
        reads.append(job_id)
        return await get(job_id)

    monkeypatch.setattr(db.jobs, "get", counted)
    return reads


async def started(db: database.Database) -> waiter_mod.Waiter:
    waiter = waiter_mod.Waiter(db)
    waiter.start()
    await asyncio.wait_for(waiter.listening.wait(), 30)
    return waiter


async def test_a_success_is_seen_without_reading_the_job_at_each_step(
    db: database.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiter = await started(db)
    try:
        reads = count_reads(db, monkeypatch)
        mark = waiter.mark()  # as the API does: taken before queueing
        job = await db.jobs.enqueue(new_job())
        waiting = asyncio.create_task(waiter.finished(job.id, queued_at=mark))
        claimed = await db.jobs.claim(WORKER)
        assert claimed is not None and claimed.id == job.id
        claimed = await db.jobs.mark_submitted(claimed, "gpu0")
        for step in range(5):
            await db.jobs.record_progress(claimed, {"value": step, "max": 5})
        await asyncio.sleep(0.2)  # the news of each step reaches the waiter meanwhile
        assert not waiting.done()
        await db.jobs.complete(claimed, [])
        status, _job = await asyncio.wait_for(waiting, 10)
        assert status is jobs.Status.SUCCEEDED
        # not one read per claim, submission and progress step, nor a first look
        assert reads == []
    finally:
        await waiter.close()


async def test_a_failure_is_read_with_its_error(db: database.Database) -> None:
    waiter = await started(db)
    try:
        job = await db.jobs.enqueue(new_job())
        waiting = asyncio.create_task(waiter.finished(job.id))
        claimed = await db.jobs.claim(WORKER)
        assert claimed is not None
        await db.jobs.fail(claimed, "the workflow has no output", transient=False)
        status, ended = await asyncio.wait_for(waiting, 10)
        assert status is jobs.Status.FAILED
        assert ended is not None and ended.error == "the workflow has no output"
    finally:
        await waiter.close()


async def test_the_end_is_found_when_its_news_is_lost(
    db: database.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiter_mod, "FALLBACK", 0.1)
    waiter = await started(db)
    job = await db.jobs.enqueue(new_job())
    waiting = asyncio.create_task(waiter.finished(job.id))
    claimed = await db.jobs.claim(WORKER)
    assert claimed is not None
    await asyncio.sleep(0.3)  # the news says: running
    await waiter.close()  # no more news: the job's end is never heard
    await db.jobs.complete(claimed, [])
    status, _job = await asyncio.wait_for(waiting, 10)
    assert status is jobs.Status.SUCCEEDED


async def test_a_break_in_the_news_makes_the_wait_read_the_job(
    db: database.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiter = await started(db)
    try:
        mark = waiter.mark()
        job = await db.jobs.enqueue(new_job())
        claimed = await db.jobs.claim(WORKER)
        assert claimed is not None
        # many other jobs' news while this one waits to be waited for: its own is
        # forgotten, so the mark vouches for nothing and the job is read
        monkeypatch.setattr(waiter_mod, "NEWS_KEPT", 2)
        await db.jobs.complete(claimed, [])
        for _ in range(3):
            await db.jobs.enqueue(new_job())

        async def forgotten() -> None:
            while waiter.mark() == mark or str(job.id) in waiter._news:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(forgotten(), 10)
        reads = count_reads(db, monkeypatch)
        status, _job = await asyncio.wait_for(waiter.finished(job.id, queued_at=mark), 1)
        assert status is jobs.Status.SUCCEEDED and reads == [job.id]
    finally:
        await waiter.close()


async def test_a_watch_tells_the_news_that_may_be_the_end_from_news_of_a_job_going_on(
    db: database.Database,
) -> None:
    waiter = await started(db)
    try:
        job = await db.jobs.enqueue(new_job())
        with waiter.watching(job.id) as watch:
            claimed = await db.jobs.claim(WORKER)
            assert claimed is not None
            await asyncio.wait_for(watch.news.wait(), 10)
            watch.clear()
            claimed = await db.jobs.mark_submitted(claimed, "gpu0")
            await asyncio.wait_for(watch.news.wait(), 10)
            # claimed, sent to the GPU: news the jobs API's stream may gather, not an end
            assert not watch.ended.is_set()
            await db.jobs.complete(claimed, [])
            await asyncio.wait_for(watch.ended.wait(), 10)
            assert watch.news.is_set()
    finally:
        await waiter.close()
