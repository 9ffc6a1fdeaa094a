"""/settings (stored per user, applied to the next job) and /forget."""

from __future__ import annotations

from tests.e2e.bot_support import running_bot
from tests.fakes.telegram import FakeTelegram
from tests.integration.worker_support import sent_values


def _button(message: dict, label_start: str) -> str:
    for row in message["reply_markup"]["inline_keyboard"]:
        for button in row:
            if button["text"].removeprefix("✓ ") == label_start:
                return str(button["callback_data"])
    raise AssertionError(f"no button {label_start!r}")


async def test_settings_apply_to_the_next_job_and_files_come_uncompressed(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(70, "/settings")
        call = await fake_telegram.wait_for_call("sendMessage", chat_id=70)
        message_id = call.result["message_id"]
        for label in ("16:9", "4", "files"):
            keyboard = next(m for m in fake_telegram.bot_messages(70)
                            if m["message_id"] == message_id)
            query = fake_telegram.user_presses(70, message_id, _button(keyboard, label))
            await fake_telegram.wait_for(lambda _, q=query: q in fake_telegram.callback_answers)
        shown = next(m for m in fake_telegram.bot_messages(70) if m["message_id"] == message_id)
        assert "Aspect ratio: 16:9" in shown["text"] and "files: on" in shown["text"]
        # Each button says what it is about: not two "✓ auto" (size and language).
        labels = [b["text"].removeprefix("✓ ")
                  for row in call.result["reply_markup"]["inline_keyboard"] for b in row]
        assert len(labels) == len(set(labels)), labels
        stack.send(70, "/f a wide lake")
        document = await stack.result(70, method="sendDocument")
        job = (await db.jobs.list_for_user(70, limit=1))[0]
        gpu_got = sent_values(fake_comfy, job.id)
        assert (gpu_got["width"], gpu_got["height"], gpu_got["steps"]) == (1360, 768, 4)
        assert document.files["document"][1] == (await db.jobs.outputs(job.id))[0].data
        # One job may say otherwise: --file no sends a photo despite the setting.
        stack.send(70, "/f a small lake --file no --width 256 --height 256")
        await stack.result(70, method="sendPhoto")
        assert len(fake_telegram.calls("sendDocument")) == 1


async def test_forget_deletes_everything_after_confirmation(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(71, "/f a fox --width 256 --height 256")
        await stack.result(71)
        await db.users.update_settings(71, {"ar": "1:1"})
        stack.send(71, "/forget")
        ask = await fake_telegram.wait_for_call("sendMessage", chat_id=71, count=2)
        assert "Are you sure?" in ask.result["text"]
        fake_telegram.user_presses(71, ask.result["message_id"], "forget:yes")
        await fake_telegram.wait_for(lambda _: any(
            m.get("text", "").startswith("Done: 1 job") for m in fake_telegram.bot_messages(71)
        ))
        assert await db.jobs.list_for_user(71) == []
        assert await db.users.get(71) is None
        assert await db.sessions.last_outputs(71) is None
