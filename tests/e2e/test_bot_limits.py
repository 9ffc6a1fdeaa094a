"""Access and limits: allow-list, bans, quotas, queue limit, cooldown; bad inputs.

Every refusal is one plain sentence and queues nothing."""

from __future__ import annotations

import pytest

from comfyveil import config
from tests.e2e.bot_support import SMALL, running_bot
from tests.fakes.telegram import FakeTelegram
from tests.integration.heartbeat_support import beating
from tests.integration.worker_support import sent_values
from tests.web.support import new_account


async def test_allow_list_refuses_strangers_until_an_admin_allows_them(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], open=False, admins=(1,),
                           allow=(40,)) as stack:
        stack.send(41, f"/f a fox {SMALL}")
        assert await stack.reply_text(41) == (
            "This bot is private. Ask its operator to allow your id 41."
        )
        assert await stack.queued_count() == 0
        stack.send(40, f"/f a fox {SMALL}")  # on the allow-list
        await stack.result(40)
        stack.send(1, "/allow 41")
        assert "41" in await stack.reply_text(1)
        stack.send(41, f"/f a fox {SMALL}")
        await stack.result(41)
        stack.send(1, "/ban 41")
        await stack.reply_text(1, count=2)
        stack.send(41, f"/f a fox {SMALL}")
        assert await stack.reply_text(41, count=3) == "You are not allowed to use this bot."


async def test_daily_quota_reached(fake_telegram: FakeTelegram, fake_comfy, db) -> None:
    limits = config.LimitsConfig(daily_quota=1)
    async with running_bot(fake_telegram, db, [fake_comfy], limits=limits,
                           admins=(1,)) as stack:
        stack.send(42, f"/f one {SMALL}")
        await stack.result(42)
        stack.send(42, f"/f two {SMALL}")
        text = await stack.reply_text(42, count=2)
        assert text == "You have used the 1 job of your daily quota; try again after 00:00 UTC."
        assert await stack.queued_count() == 1
        stack.send(1, "/quota 42 5")  # an admin raises it
        await stack.reply_text(1)
        stack.send(42, f"/f three {SMALL}")
        await stack.result(42, count=2)


async def test_queue_limit_and_cooldown(fake_telegram: FakeTelegram, fake_comfy, db) -> None:
    limits = config.LimitsConfig(max_queued=1)
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False,
                           limits=limits) as stack:
        stack.send(43, f"/f one {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=43)
        stack.send(43, f"/f two {SMALL}")
        text = await stack.reply_text(43, count=2)
        assert text.startswith("You already have 1 job waiting or running")
        assert await stack.queued_count() == 1
    limits = config.LimitsConfig(cooldown=60)
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False,
                           limits=limits) as stack:
        stack.send(44, f"/f one {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=44)
        stack.send(44, f"/f two {SMALL}")
        assert (await stack.reply_text(44, count=2)).startswith("Wait 6")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("/f", "Write a prompt after /f, for example: /f a red fox."),
        ("/f " + "fox " * 2500, "The prompt is 9999 characters long; the limit is 2000."),
        ("/f a fox --sampler euler",
         "/f has no option --sampler. Allowed: --ar, --file, --height, --seed, --steps, "
         "--width."),
        ("/f a fox --steps 50", "Steps must be between 1 and 8 (got 50)."),
        ("/f a fox --ar 10:1", "The aspect ratio 10:1 is too extreme; use one between 1:4 "
                               "and 4:1."),
        ("/f a fox --no blurry", "/f has no negative prompt, so --no cannot be used."),
        ("/qwen make it night --ar 16:9", "/qwen has no width and height, so --ar cannot be "
                                          "used."),
    ],
)
async def test_bad_inputs_get_one_sentence_and_queue_nothing(
    fake_telegram: FakeTelegram, fake_comfy, db, text: str, answer: str
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(45, text)
        assert await stack.reply_text(45) == answer
        assert len(fake_telegram.calls("sendMessage")) == 1
        assert await stack.queued_count() == 0


async def test_the_prompt_length_limit_is_exact_and_the_gpu_gets_the_whole_prompt(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    limits = config.LimitsConfig(max_prompt_length=40)
    prompt = ("a fox in deep snow under the northern li" + "ght")[:40]
    async with running_bot(fake_telegram, db, [fake_comfy], limits=limits) as stack:
        stack.send(46, f"/f {prompt}x {SMALL}")
        assert await stack.reply_text(46) == (
            "The prompt is 41 characters long; the limit is 40."
        )
        stack.send(46, f"/f {prompt} {SMALL}")
        await stack.result(46)
    job = (await db.jobs.list_for_user(46, limit=1))[0]
    assert sent_values(fake_comfy, job.id)["prompt"] == prompt


async def test_admin_overviews_of_users_and_backends(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False, admins=(1,),
                           open=True) as stack:
        stack.send(45, f"/f a fox {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=45)  # queued, no worker
        await beating(db, "gpu-host-1", running=2)
        await beating(db, "old-host", gone=True)
        stack.send(1, "/users")
        users = await stack.reply_text(1)
        assert "45 user · 1/100 today" in users  # (the code tag is HTML, gone in the text)
        stack.send(1, "/backends")
        backends = await stack.reply_text(1, count=2)
        assert "Jobs waiting in the queue: 1" in backends
        assert "gpu0: up" in backends
        assert "Workers\ngpu-host-1 (" in backends and "): alive · 2 jobs running" in backends
        assert "old-host (" in backends and "): gone · 0 jobs running" in backends
        stack.send(45, "/users")  # not an admin
        assert await stack.reply_text(45, count=2) == "Only the bot's admins can do that."


async def test_backends_shows_each_gpus_measured_run_time(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], admins=(1,), open=True) as stack:
        stack.send(1, "/backends")
        before = await stack.reply_text(1)
        assert "a run" not in before  # nothing measured yet
        stack.send(1, f"/f a fox {SMALL}")
        await fake_telegram.wait_for_call("sendPhoto", chat_id=1)
        sent = len(fake_telegram.calls("sendMessage"))
        stack.send(1, "/backends")
        after = await stack.reply_text(1, count=sent + 1)
        assert "flux_schnell_full_text_to_image: " in after
        assert "s a run" in after and "(1 measured)" in after


async def test_backends_names_missing_model_files_and_the_command_that_installs_them(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    import asyncio

    comfy = await fake_comfy_factory(models={"checkpoints": []})
    async with running_bot(fake_telegram, db, [comfy], admins=(1,), open=True) as stack:
        for attempt in range(1, 40):  # until the pool has read the GPU's models
            stack.send(1, "/backends")
            text = await stack.reply_text(1, count=attempt)
            if "comfyveil models install" in text:
                break
            await asyncio.sleep(0.25)
        assert "/f: flux1-schnell.safetensors, ae.safetensors" in text
        assert "comfyveil models install f --comfyui-dir DIR" in text
        assert "comfyveil models install sd3 --comfyui-dir DIR" in text


async def test_allow_and_ban_refuse_a_group_id_instead_of_claiming_it_done(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    """/allow with a group's id used to answer "User ... may use the bot now" and change
    nothing for the group's members: it is refused in one sentence, nothing stored."""
    async with running_bot(fake_telegram, db, [fake_comfy], open=False, admins=(1,)) as stack:
        stack.send(1, "/allow -1001234567890")
        answer = await stack.reply_text(1)
        assert answer.startswith("-1001234567890 is a group's id, not a user's: /allow"), answer
        assert "[telegram] allow" in answer
        stack.send(1, "/ban -500")
        assert (await stack.reply_text(1, count=2)).startswith("-500 is a group's id")
        assert await db.users.get(-1001234567890) is None and await db.users.get(-500) is None
        stack.send(44, f"/f a fox {SMALL}", chat_id=-1001234567890, chat_type="supergroup")
        assert (await stack.reply_text(-1001234567890)).startswith("This bot is private.")


async def test_users_names_web_accounts_the_command_line_and_admins_as_such(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    """/users showed a web account as a raw negative id, `comfyveil submit`'s jobs as
    "0 user" and an admin named in the configuration as "user"."""
    from comfyveil.store import jobs

    account = await new_account(db, "Mina")
    for user in (account.user_id, 0):
        await db.jobs.enqueue(jobs.NewJob(user_id=user, chat_id=user, command="f",
                                          workflow_hash="h" * 64, params={"prompt": "a fox"}))
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False, admins=(1,)) as stack:
        stack.send(1, "/help")
        await stack.reply_text(1)
        stack.send(1, "/users")
        listing = (await stack.reply_text(1, count=2)).splitlines()
    web_line = next(line for line in listing if "Mina" in line)
    assert web_line.startswith(f"web account Mina ({account.user_id}) user · 1/")
    assert any(line.startswith("the command line user · 1/") for line in listing), listing
    assert any(line.startswith("1 admin · ") for line in listing), listing
