"""The place in the queue a user is shown never goes back (issue 23 item 13), while
the store's own answer may: round-robin lets a user never served go first."""

from __future__ import annotations

from comfyveil.store import database, jobs
from comfyveil.telegram import status


def new_job(user: int) -> jobs.NewJob:
    return jobs.NewJob(
        user_id=user, chat_id=user, command="f", workflow_hash="h" * 64,
        params={"prompt": "a red fox"},
    )


async def test_a_job_shown_first_stays_first_when_round_robin_puts_another_ahead(
    db: database.Database,
) -> None:
    served = await db.jobs.enqueue(new_job(1))  # user 1 was served before ...
    claimed = await db.jobs.claim("w")
    assert claimed is not None and claimed.id == served.id
    await db.jobs.complete(claimed)
    mine = await db.jobs.enqueue(new_job(1))  # ... and queues again: first in line
    tracker = status.StatusTracker(None, db, backends=lambda: ["gpu0"])  # type: ignore[arg-type]
    assert "next in line" in await tracker.text_for(mine)

    await db.jobs.enqueue(new_job(2))  # a user never served goes ahead of user 1
    wait = await db.jobs.wait(mine.id, backends=["gpu0"])
    assert wait is not None and wait.place == 2  # the queue as it is now
    text = await tracker.text_for(mine)
    assert "next in line" in text and "#2" not in text, text  # the place shown stays
