"""A user sends /f and gets a photo; the status message goes away."""

from __future__ import annotations

import time

from tests.e2e.bot_support import SMALL, no_call, running_bot, to_chat
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram
from tests.integration.worker_support import sent_values


async def test_f_sends_a_photo_and_removes_the_status(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(10, f"/f a red fox in snow --seed 42 {SMALL}")
        photo = await stack.result(10)
        caption = photo.result["caption"]
        assert caption.startswith("/f · seed 42")
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=10)
        assert "Queued" in status.result["text"] or "Starting" in status.result["text"]
        await fake_telegram.wait_for(
            lambda _: status.result["message_id"] in fake_telegram.deleted(10)
        )
        buttons = [b["text"] for b in photo.result["reply_markup"]["inline_keyboard"][0]]
        assert len(buttons) == 3
        # The fake ComfyUI ran exactly one prompt, with the user's values.
        assert len(fake_comfy.prompts) == 1
        job = (await db.jobs.list_for_user(10, limit=1))[0]
        assert sent_values(fake_comfy, job.id) == {
            "prompt": "a red fox in snow", "seed": 42, "steps": 4, "width": 256,
            "height": 256,
        }


async def test_help_lists_enabled_commands_and_menu_is_registered(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        menu = {c["command"] for c in fake_telegram.commands.get("default", [])} or {
            c["command"] for cmds in fake_telegram.commands.values() for c in cmds
        }
        assert {"f", "fd", "sd3", "wan", "qwen", "help", "cancel"} <= menu
        stack.send(11, "/help")
        text = await stack.reply_text(11)
        assert "/f Flux Schnell" in text and "/qwen" in text
        assert "--steps" in text and "(1–8)" in text

        stack.send(11, "/workflows disable sd3")
        refused = await stack.reply_text(11, count=2)
        assert refused == "Only the bot's admins can do that."


async def test_admin_disables_a_workflow_and_users_no_longer_see_it(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], admins=(1,)) as stack:
        stack.send(1, "/workflows disable sd3")
        assert await stack.reply_text(1) == "/sd3 is off now."
        stack.send(12, "/sd3 a castle")
        assert await stack.reply_text(12) == "/sd3 is switched off."
        stack.send(12, "/help")
        assert "/sd3" not in await stack.reply_text(12, count=2)
        assert await stack.queued_count() == 0


async def test_plain_text_gets_a_hint_and_groups_stay_quiet(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(13, "hello there")
        assert "/help" in await stack.reply_text(13)
        # In a group: chatter and commands for another bot are ignored...
        stack.send(13, "hello everyone", chat_id=-500, chat_type="group")
        stack.send(13, "/f a fox", chat_id=-500, chat_type="group")
        stack.send(13, "/f@OtherBot a fox", chat_id=-500, chat_type="group")
        # ...a command addressed to us is answered.
        stack.send(13, f"/f@ComfyveilTestBot a fox {SMALL}", chat_id=-500, chat_type="group")
        await stack.result(-500, count=2)
        # A third photo or a hint in the group would come now; neither may.
        await no_call(fake_telegram, lambda c: c.method == "sendPhoto" or (
            str(c.params.get("chat_id")) == "-500" and "/help" in str(c.params.get("text"))
        ), within=1.5)
        photos = fake_telegram.calls("sendPhoto")
        assert len(photos) == 2  # "/f" and "/f@ComfyveilTestBot"; not "/f@OtherBot"
        texts = [c.params.get("text") for c in fake_telegram.calls("sendMessage")
                 if str(c.params.get("chat_id")) == "-500"]
        assert not any("/help" in str(t) for t in texts)


async def test_a_quick_result_arrives_alone_without_a_status_message(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    # A delay a quick job beats even on a busy machine (0.5 s did not, under load).
    async with running_bot(fake_telegram, db, [fake_comfy], status_delay=2.0) as stack:
        stack.send(13, f"/f a quick fox {SMALL}")
        await stack.result(13)
        # Past the delay the pending status post must stand down: no message, no deletion.
        await no_call(fake_telegram, to_chat(13, "sendMessage", "deleteMessage"), within=2.5)
        assert fake_telegram.calls("sendMessage") == []
        assert fake_telegram.deleted(13) == []
        assert len(fake_telegram.calls("sendPhoto")) == 1


async def test_a_slow_job_shows_its_status_after_the_delay_then_removes_it(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    slow = await fake_comfy_factory(step_delay=0.4)
    async with running_bot(fake_telegram, db, [slow], status_delay=0.3) as stack:
        sent_at = time.monotonic()
        stack.send(14, f"/f a slow fox --steps 4 {SMALL}")
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=14)
        assert status.at - sent_at >= 0.3
        assert fake_telegram.calls("sendPhoto") == [], "the status came before the result"
        photo = await stack.result(14)
        assert photo.at > status.at
        await fake_telegram.wait_for(
            lambda _: status.result["message_id"] in fake_telegram.deleted(14)
        )
        assert len(fake_telegram.calls("sendMessage")) == 1
