"""The user's jobs: /cancel (queued and running), /again and re-roll, /status, /history."""

from __future__ import annotations

import asyncio

from comfyveil import config
from comfyveil.store import jobs
from tests.e2e.bot_support import SMALL, running_bot
from tests.fakes.telegram import FakeTelegram
from tests.integration.worker_support import sent_values


def texts_of(fake: FakeTelegram, chat: int) -> list[str]:
    return [m.get("text", "") for m in fake.bot_messages(chat)]


async def test_cancel_a_queued_job(fake_telegram: FakeTelegram, fake_comfy, db) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False) as stack:
        stack.send(30, f"/f a fox {SMALL}")
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=30)
        assert status.result["text"].startswith("Queued · next in line")
        stack.send(30, "/cancel")
        reply = await stack.reply_text(30, count=2)
        assert reply.startswith("Cancelled job #")
        job = (await db.jobs.list_for_user(30, limit=1))[0]
        assert job.status is jobs.Status.CANCELLED
        await fake_telegram.wait_for(
            lambda _: "Cancelled." in texts_of(fake_telegram, 30)
        )
        assert fake_telegram.calls("sendPhoto") == []


async def test_cancel_a_running_job_by_its_id(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    slow = await fake_comfy_factory(step_delay=0.4)
    async with running_bot(fake_telegram, db, [slow]) as stack:
        stack.send(31, f"/f a slow fox --steps 8 {SMALL}")
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=31)
        # The status message follows the job: running, with the sampler's steps.
        await fake_telegram.wait_for(
            lambda _: any("step" in t for t in texts_of(fake_telegram, 31)), timeout=10
        )
        job = (await db.jobs.list_for_user(31, limit=1))[0]
        stack.send(31, f"/cancel #{job.id.hex[:8]}")
        assert (await stack.reply_text(31, count=2)).startswith("Stopping job #")
        await fake_telegram.wait_for(
            lambda _: any(m["message_id"] == status.result["message_id"]
                          and m.get("text") == "Cancelled." for m in
                          fake_telegram.bot_messages(31)), timeout=10,
        )
        assert (await db.jobs.get(job.id)).status is jobs.Status.CANCELLED
        assert slow.interrupts, "the GPU was told to stop"
        await asyncio.sleep(0.3)
        assert fake_telegram.calls("sendPhoto") == []


async def test_again_and_reroll_use_new_seeds(fake_telegram: FakeTelegram, fake_comfy, db) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(32, f"/f a fox --seed 7 {SMALL}")
        first = await stack.result(32)
        stack.send(32, "/again")
        await stack.result(32, count=2)
        button = first.result["reply_markup"]["inline_keyboard"][0][0]
        fake_telegram.user_presses(32, first.result["message_id"], button["callback_data"])
        await stack.result(32, count=3)
        # What the GPU was given: the same prompt and size, a new seed each time.
        runs = [sent_values(fake_comfy, j.id) for j in await db.jobs.list_for_user(32, limit=3)]
        seeds = {r["seed"] for r in runs}
        assert len(seeds) == 3 and 7 in seeds
        assert {(r["width"], r["height"]) for r in runs} == {(256, 256)}
        assert {r["prompt"] for r in runs} == {"a fox"}


async def test_status_and_history(fake_telegram: FakeTelegram, fake_comfy, db) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False) as stack:
        stack.send(33, f"/f first {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=33)
        stack.send(33, f"/f second {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=33, count=2)
        stack.send(33, "/status")
        status = await stack.reply_text(33, count=3)
        assert status.count("Queued · next in line") == 1 and status.count("Queued #2") == 1
        stack.send(33, "/history")
        history = await stack.reply_text(33, count=4)
        assert "first" in history and "second" in history and "queued" in history


async def test_again_refuses_what_would_not_differ_as_the_web_does(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    """/again after a workflow without a seed would repeat the same picture: refused in
    the web's words, nothing queued (issue 23 item 17, one rule for chat and web)."""
    from pathlib import Path

    from comfyveil.comfy import workflow
    from tests.e2e.bot_support import png

    await db.commands.seed(
        [workflow.load(Path(__file__).parents[1] / "data" / "workflows" / "invert.toml")]
    )
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(34, photo=png(), caption="/invert")
        await stack.result(34)
        stack.send(34, "/again")
        answer = await stack.reply_text(34, count=2)
        assert answer.startswith("This job cannot run again with a new seed"), answer
        assert len(await db.jobs.list_for_user(34, limit=5)) == 1


async def test_job_commands_in_a_group_show_only_that_groups_jobs(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    """/history, /status and /again in a group never bring a member's private prompts
    into it: they see (and repeat) only the jobs asked for in that group."""
    group = -570
    roomy = config.LimitsConfig(max_queued=10)
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False,
                           limits=roomy) as stack:
        stack.send(36, f"/f my secret diary {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=36)
        stack.send(36, f"/f a cat for everyone {SMALL}", chat_id=group, chat_type="group")
        await fake_telegram.wait_for_call("sendMessage", chat_id=group)
        stack.send(36, f"/f another secret {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=36, count=2)

        stack.send(36, "/history", chat_id=group, chat_type="group")
        history = await stack.reply_text(group, count=2)
        assert "a cat for everyone" in history
        assert "secret" not in history
        assert "Only your jobs from this chat" in history
        stack.send(36, "/status", chat_id=group, chat_type="group")
        status = await stack.reply_text(group, count=3)
        assert status.count("Queued #") == 1
        stack.send(36, "/again", chat_id=group, chat_type="group")
        again = await stack.reply_text(group, count=4)
        assert again.startswith("Queued"), again
        newest = (await db.jobs.list_for_user(36, limit=1))[0]
        assert newest.params["prompt"] == "a cat for everyone"
        assert newest.chat_id == group

        stack.send(36, "/history")
        private = await stack.reply_text(36, count=3)
        assert "my secret diary" in private and "a cat for everyone" in private


async def test_a_request_whose_status_message_failed_hears_it_was_cancelled(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    """The Bot API failed the status message (a 500), so a /cancel finds no message to turn
    into "Cancelled.": the request gets the sentence in a reply of its own, not only the
    /cancel's answer naming a job id its user never saw, and no status message comes after."""
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False) as stack:
        fake_telegram.fail_next("sendMessage", 500, "Internal Server Error")
        request = stack.send(32, f"/f a fox {SMALL}")
        await fake_telegram.wait_for(
            lambda calls: any(c.method == "sendMessage" and not c.ok for c in calls)
        )
        stack.send(32, "/cancel")
        await fake_telegram.wait_for(
            lambda _: any(t.startswith("Cancelled job #") for t in texts_of(fake_telegram, 32))
        )
        await asyncio.sleep(3.0)  # past the status message's second try (2 s)
        answers = [
            m["text"] for m in fake_telegram.bot_messages(32)
            if (m.get("reply_to_message") or {}).get("message_id") == request["message_id"]
        ]
        assert answers == ["Cancelled."]
        assert not any(t.startswith("Queued") for t in texts_of(fake_telegram, 32))


async def test_a_cancel_sent_right_after_a_request_cancels_that_request_not_an_older_one(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False) as stack:
        stack.send(31, f"/f an older fox {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=31)
        # Sent together, as a user does: one getUpdates answer holds both. Handled side by
        # side, "/cancel" (the newest job) found the older one before the newer was queued.
        stack.send(31, f"/f a newer fox {SMALL}")
        stack.send(31, "/cancel")
        await fake_telegram.wait_for(
            lambda _: any(t.startswith("Cancelled job #") for t in texts_of(fake_telegram, 31))
        )
        found = await db.jobs.list_for_user(31, limit=5)
        by_prompt = {str(j.params.get("prompt")): j.status for j in found}
        assert by_prompt == {
            "an older fox": jobs.Status.QUEUED,
            "a newer fox": jobs.Status.CANCELLED,
        }
