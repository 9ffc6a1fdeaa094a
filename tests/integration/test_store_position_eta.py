"""A queued job's place and ETA read in one query, as the status message shows them."""

from __future__ import annotations

import asyncio

import pytest

from comfyveil.store import database, jobs

Database = database.Database


def new_job(user: int, command: str) -> jobs.NewJob:
    return jobs.NewJob(
        user_id=user, chat_id=user, command=command, workflow_hash="h" * 64,
        params={"prompt": "a red fox"},
    )


async def test_position_and_eta_agree_with_position_and_eta(db: Database) -> None:
    first = await db.jobs.enqueue(new_job(1, "f"))
    claimed = await db.jobs.claim("w")
    assert claimed is not None and claimed.id == first.id
    await asyncio.sleep(0.2)
    await db.jobs.complete(claimed)
    measured = (await db.jobs.durations(["f"]))["f"]

    unmeasured = await db.jobs.enqueue(new_job(2, "x"))  # no run of /x measured yet
    mine = await db.jobs.enqueue(new_job(2, "f"))

    # /x ahead counts as long as /f's own mean; the queue ahead is shared over 2 runners.
    position, eta = await db.jobs.position_and_eta(mine.id, parallel=2)
    assert position == 1
    assert eta == pytest.approx(measured / 2 + measured)
    assert (position, eta) == (
        await db.jobs.position(mine.id), await db.jobs.eta(mine.id, parallel=2)
    )
    assert await db.jobs.position_and_eta(unmeasured.id) == (0, None)

    # Claimed: no place in the queue any more, and the running job's ETA.
    running = await db.jobs.claim("w")
    assert running is not None and running.id == unmeasured.id
    assert await db.jobs.position_and_eta(unmeasured.id) == (None, None)
    position, eta = await db.jobs.position_and_eta(mine.id)
    assert position == 0 and eta == pytest.approx(measured)
