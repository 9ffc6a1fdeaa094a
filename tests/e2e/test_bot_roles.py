"""What the operator allowed, no more: admins-only commands, limits that /forget keeps,
a cooldown that concurrent updates cannot slip past, refusals before any download."""

from __future__ import annotations

import asyncio
from typing import Any

from comfyveil import config
from comfyveil.comfy import workflow
from comfyveil.store import database, jobs
from tests.e2e.bot_support import SMALL, png, running_bot
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram
from tests.web.support import wait_for

ADMIN = 1


async def _admins_only(db: database.Database, command: str) -> None:
    """What `comfyveil workflows add --admins-only` stores, for a shipped workflow."""
    await db.commands.seed()
    wf = workflow.find(command)
    assert wf.source is not None
    await db.commands.add(
        wf,
        wf.source.read_text(),
        wf.source.with_suffix(".json").read_text(),
        allowed_roles=["admin"],
    )


async def _answer(telegram: FakeTelegram, query: str) -> str:
    await telegram.wait_for(lambda _: query in telegram.callback_answers)
    return str(telegram.callback_answers[query].get("text"))


def _texts(telegram: FakeTelegram, chat: int) -> list[str]:
    return [
        str(c.result["text"])
        for c in telegram.calls("sendMessage")
        if c.result["chat"]["id"] == chat
    ]


async def _said(telegram: FakeTelegram, chat: int, text: str) -> None:
    """Wait until the bot has sent `text` to `chat`."""
    await telegram.wait_for(lambda _: text in _texts(telegram, chat))


def _menu(telegram: FakeTelegram, scope: str) -> set[str]:
    return {
        c["command"] for key, listed in telegram.commands.items() if scope in key for c in listed
    }


async def test_admins_only_command_is_neither_run_nor_shown_for_users(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    await _admins_only(db, "fd")
    async with running_bot(fake_telegram, db, [fake_comfy], admins=(ADMIN,)) as stack:
        stack.send(50, f"/fd a fox {SMALL}")
        assert await stack.reply_text(50) == "Only the bot's admins can use /fd."
        assert await stack.queued_count() == 0
        stack.send(50, "/help")
        assert "/fd" not in await stack.reply_text(50, count=2)
        stack.send(ADMIN, "/help")
        assert "/fd" in await stack.reply_text(ADMIN)
        assert "fd" not in _menu(fake_telegram, '"default"')
        assert "f" in _menu(fake_telegram, '"default"')
        assert "fd" in _menu(fake_telegram, f'"chat_id": {ADMIN}')
        # Every command a user has is offered: /web and /forget in the menu and in /help;
        # an admin's menu has the admin commands, no one else's does (issue 23 rough).
        assert {"web", "forget"} <= _menu(fake_telegram, '"default"')
        assert {"users", "allow", "ban", "quota", "backends", "workflows", "policy"} <= _menu(
            fake_telegram, f'"chat_id": {ADMIN}')
        assert not {"users", "ban"} & _menu(fake_telegram, '"default"')
        help_text = await stack.reply_text(50, count=2)
        assert "/web" in help_text and "/forget" in help_text
        stack.send(ADMIN, f"/fd a fox {SMALL} --steps 2")
        await stack.result(ADMIN)


async def test_reroll_again_and_edit_respect_a_command_made_admins_only(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], admins=(ADMIN,)) as stack:
        stack.send(51, f"/f a fox {SMALL}")
        photo = await stack.result(51)
        # the operator keeps /f and /qwen for admins from now on
        await _admins_only(db, "f")
        await _admins_only(db, "qwen")
        await stack.bot.services.commands.refresh()
        reroll, edit = photo.result["reply_markup"]["inline_keyboard"][0][:2]
        query = fake_telegram.user_presses(51, photo.result["message_id"], reroll["callback_data"])
        assert await _answer(fake_telegram, query) == "Only the bot's admins can use /f."
        stack.send(51, "/again")
        await _said(fake_telegram, 51, "Only the bot's admins can use /f.")
        query = fake_telegram.user_presses(51, photo.result["message_id"], edit["callback_data"])
        assert await _answer(fake_telegram, query) == (
            "No command that edits images is open to you on this bot."
        )
        stack.send(51, "/qwen make it night")
        await _said(fake_telegram, 51, "Only the bot's admins can use /qwen.")
        stack.send(51, "/start")
        await fake_telegram.wait_for(
            lambda _: any(t.startswith("Hi!") for t in _texts(fake_telegram, 51))
        )
        assert all("/f " not in t for t in _texts(fake_telegram, 51) if t.startswith("Hi!"))
        assert len(await db.jobs.list_for_user(51, limit=10)) == 1


async def test_queue_forget_repeat_does_not_get_past_the_limits(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    limits = config.LimitsConfig(max_queued=3, daily_quota=3)
    async with running_bot(
        fake_telegram, db, [fake_comfy], worker=False, limits=limits, admins=(ADMIN,)
    ) as stack:
        for n in range(3):
            stack.send(52, f"/f fox {n} {SMALL}")
            await fake_telegram.wait_for_call("sendMessage", chat_id=52, count=n + 1)
        stack.send(52, "/forget")
        ask = await fake_telegram.wait_for_call("sendMessage", chat_id=52, count=4)
        yes = ask.result["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
        query = fake_telegram.user_presses(52, ask.result["message_id"], yes)
        assert await _answer(fake_telegram, query) == "Deleted."
        assert await stack.queued_count() == 0
        stack.send(52, f"/f once more {SMALL}")
        assert await stack.reply_text(52, count=5) == (
            "You have used all 3 jobs of your daily quota; try again after 00:00 UTC."
        )
        assert await stack.queued_count() == 0
        # an admin's quota outlives the user's /forget (a banned user cannot /forget;
        # test_store_users has the ban kept through forgetting)
        stack.send(ADMIN, "/quota 53 1")
        await stack.reply_text(ADMIN)
        stack.send(ADMIN, "/ban 54")
        await stack.reply_text(ADMIN, count=2)
        stack.send(ADMIN, "/ban")  # no id: how to write it
        assert await stack.reply_text(ADMIN, count=3) == (
            "Write /ban and the user's id, e.g. /ban 123456789."
        )
        stack.send(53, "/forget")
        ask = await fake_telegram.wait_for_call("sendMessage", chat_id=53)
        yes = ask.result["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
        query = fake_telegram.user_presses(53, ask.result["message_id"], yes)
        assert await _answer(fake_telegram, query) == "Deleted."
        stack.send(53, f"/f one {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=53, count=2)
        stack.send(53, f"/f two {SMALL}")
        assert (await stack.reply_text(53, count=3)).startswith("You have used the 1 job")
        stack.send(54, f"/f a fox {SMALL}")
        assert await stack.reply_text(54) == "You are not allowed to use this bot."


async def test_forgetting_stops_the_users_running_job_on_its_gpu(
    fake_telegram: FakeTelegram, fake_comfy_factory: Any, db: database.Database
) -> None:
    slow: FakeComfyUI = await fake_comfy_factory(step_delay=0.4)
    async with running_bot(fake_telegram, db, [slow]) as stack:
        stack.send(55, f"/f a slow fox --steps 8 {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=55)
        job = (await db.jobs.list_for_user(55, limit=1))[0]
        await fake_telegram.wait_for(  # running on the GPU: the sampler's steps show
            lambda _: any("step" in str(m.get("text")) for m in fake_telegram.bot_messages(55)),
            timeout=10,
        )
        stack.send(55, "/forget")
        ask = await fake_telegram.wait_for_call("sendMessage", chat_id=55, count=2)
        yes = ask.result["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
        fake_telegram.user_presses(55, ask.result["message_id"], yes)
        await fake_telegram.wait_for(lambda _: bool(slow.interrupts), timeout=10)
        assert slow.interrupts[0].get("prompt_id") in (None, str(job.id))

        async def ended() -> jobs.Job | None:
            while (row := await db.jobs.get(job.id)) is not None and not row.status.finished:
                await asyncio.sleep(0.05)
            return row

        row = await asyncio.wait_for(ended(), 10)
        assert row is not None and row.status is jobs.Status.CANCELLED and row.params == {}
        assert fake_telegram.calls("sendPhoto") == []


async def test_concurrent_commands_within_the_cooldown_queue_exactly_one(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    limits = config.LimitsConfig(cooldown=60, max_queued=10)
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False, limits=limits) as stack:
        for n in range(4):  # one getUpdates batch, handled concurrently
            stack.send(56, f"/f fox {n} {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=56, count=4)
        texts = _texts(fake_telegram, 56)
        assert sum(t.startswith("Wait ") for t in texts) == 3, texts
        assert await stack.queued_count() == 1


async def test_a_user_over_the_limit_is_refused_before_the_photo_is_downloaded(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    limits = config.LimitsConfig(max_queued=1)
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False, limits=limits) as stack:
        stack.send(57, f"/f a fox {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=57)
        stack.send(57, photo=png(), caption="/qwen make it night")
        text = await stack.reply_text(57, count=2)
        assert text.startswith("You already have 1 job waiting or running")
        assert fake_telegram.calls("getFile") == []
        assert fake_telegram.file_downloads == []
        assert await stack.queued_count() == 1


async def test_switching_a_command_off_and_on_reaches_the_bot_at_once(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    """`comfyveil workflows disable fd` (another process) takes effect for the next
    message, not up to 30 s later, and a user hears the command is switched off, not
    that there is no such command (issue 23 rough)."""
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        registry = stack.bot.services.commands
        await registry.get("fd")  # the registry has read the table

        async def offered(wanted: bool) -> None:
            # all() re-reads the table only every 30 s: within the bound, only the NOTIFY
            # can have brought the change
            async def seen() -> bool:
                return ("fd" in [e.name for e in await registry.all()]) is wanted

            await wait_for(seen, timeout=10)

        await db.commands.set_enabled("fd", False)
        await offered(False)
        stack.send(80, f"/fd a fox {SMALL}")
        assert await stack.reply_text(80) == "/fd is switched off."
        assert await stack.queued_count() == 0
        await db.commands.set_enabled("fd", True)
        await offered(True)
        stack.send(80, f"/fd a fox {SMALL}")
        await stack.result(80)


async def test_admins_have_no_limits_and_users_and_quota_say_so(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    """/users shows no "0/4 today" for an admin, and /quota for an admin says it applies
    only once they are no longer one (issue 23 item 9)."""
    limits = config.LimitsConfig(daily_quota=4)
    async with running_bot(fake_telegram, db, [fake_comfy], admins=(ADMIN,),
                           limits=limits) as stack:
        stack.send(52, "/help")  # a user the bot has seen
        await stack.reply_text(52)
        stack.send(ADMIN, "/users")
        listing = await stack.reply_text(ADMIN)
        admin_line = next(line for line in listing.splitlines() if f"{ADMIN}</code>" in line
                          or line.startswith(f"{ADMIN} "))
        assert "/4" not in admin_line and "No limits: admins have none." in admin_line
        user_line = next(line for line in listing.splitlines() if "52" in line)
        assert "0/4 today" in user_line and "No limits" not in user_line
        stack.send(ADMIN, f"/quota {ADMIN} 50")
        assert await stack.reply_text(ADMIN, count=2) == (
            f"User {ADMIN} may run 50 jobs a day. Admins have no limits: {ADMIN}'s quota "
            "applies once they are no longer an admin."
        )


async def test_a_command_menu_telegram_refused_at_start_neither_stops_the_bot_nor_stays_unset(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    # The menu is a courtesy: a 500 on setMyCommands as the bot starts used to end
    # `comfyveil run`, web front end and worker with it.
    fake_telegram.fail_next("setMyCommands", 500, "Internal Server Error")
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(50, "/help")
        assert "/f" in await stack.reply_text(50)
        await fake_telegram.wait_for(lambda _: "f" in _menu(fake_telegram, '"default"'),
                                     timeout=30)
