"""A job's ending answers the message that asked for it, even when the bot that queued
it is gone and the job has no status message to turn into its sentence; a status
message the Bot API failed to take does not tell its user to try again."""

from __future__ import annotations

from typing import Any

from tests.e2e.bot_support import SMALL, running_bot
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram
from tests.integration.worker_support import wait_for


async def test_a_cancelled_job_without_a_status_message_answers_its_request_after_a_restart(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    # The Bot API failed the status message: the job is queued with none on record.
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False) as stack:
        fake_telegram.fail_next("sendMessage", 500, "Internal Server Error")
        asked = stack.send(67, f"/f a heron {SMALL}")
        await wait_for(lambda: db.jobs.list_for_user(67, limit=1), timeout=10)
    [job] = await db.jobs.list_for_user(67, limit=1)
    assert job.status_message_id is None
    # queued: its user is not told to try again (which would queue it twice)
    said = [m.get("text", "") for m in fake_telegram.messages(67)]
    assert not [t for t in said if t.startswith("Something went wrong")], said
    # Its worker died while its user asked to cancel it: the lease's end cancels it.
    claimed = await db.jobs.claim("gone-worker")
    assert claimed is not None and claimed.id == job.id
    await db.jobs.cancel(job.id, by_user=67)
    [ended] = await db.jobs.requeue_own("gone-worker")
    assert ended.status.value == "cancelled"

    # The bot started again delivers the ending from the database alone.
    async with running_bot(fake_telegram, db, [fake_comfy]):

        def said(_calls: Any) -> list[dict[str, Any]]:
            return [
                m
                for m in fake_telegram.messages(67)
                if m.get("text") == "Cancelled."
                and (m.get("reply_to_message") or {}).get("message_id") == asked["message_id"]
            ]

        found = None
        try:
            found = await fake_telegram.wait_for(said, timeout=15)
        finally:
            shown = [(m.get("text"), m.get("reply_to_message")) for m in fake_telegram.messages(67)]
            assert found, f"no 'Cancelled.' answering the request; the chat shows {shown}"
