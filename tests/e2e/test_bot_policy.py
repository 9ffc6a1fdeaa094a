"""The content policy through the fake Bot API: refused prompts (evasions included) queue
nothing and are counted without their text; innocent prompts pass; results go behind a
spoiler per command, per chat, per workflow and per user; /policy for admins."""

from __future__ import annotations

from comfyveil import config, policy
from comfyveil.cli import submit as submit_cli
from comfyveil.comfy import workflow
from tests.e2e.bot_support import SMALL, running_bot
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram

REFUSED = "This bot does not accept that prompt; nothing was queued."
RULES = policy.from_table(
    {
        "terms": ["gore", "behead*"],
        "patterns": [r"\bkill(ed|ing)?\s+(him|her)\b"],
        "commands": {"wan": {"terms": ["blood"]}},
    }
)
EVASIONS = [
    "a lighthouse and ｇｏｒｅ",  # full-width
    "a lighthouse and g\u200dore",  # zero-width joiner
    "a lighthouse and gоre",  # Cyrillic о
    "a lighthouse and ɢᴏʀᴇ",  # small capitals
    "a lighthouse and g o r e",
    "a lighthouse, Beheading",
    "a lighthouse keeper KÍLLED  HIM",
]
INNOCENT = [
    "a gorgeous lighthouse",
    "a gorilla by a lighthouse --no gore, blood",  # the negative prompt is not checked
    "маяк в тумане",
    "فانوس دریایی در مه",
    "雾中的灯塔",
    "a blood orange",  # "blood" is refused only in /wan
]
LIMITS = config.LimitsConfig(max_queued=50)


def _spoiled(call) -> bool:
    return call.params.get("has_spoiler") in (True, "true") and bool(
        call.result.get("has_media_spoiler")
    )


async def test_refused_prompts_queue_nothing_and_innocent_ones_pass(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(
        fake_telegram, db, [fake_comfy], worker=False, policy=RULES, limits=LIMITS, admins=(1,)
    ) as stack:
        for count, prompt in enumerate([*EVASIONS, "a blood moon"], start=1):
            command = "/wan" if prompt == "a blood moon" else "/f"
            stack.send(80, f"{command} {prompt} {SMALL}")
            assert await stack.reply_text(80, count=count) == REFUSED, prompt
        assert await stack.queued_count() == 0
        for queued, prompt in enumerate(INNOCENT, start=1):
            command = "/sd3" if "--no" in prompt else "/f"
            stack.send(81, f"{command} {prompt} {SMALL}")
            await fake_telegram.wait_for_call("sendMessage", chat_id=81, count=queued)
            assert await stack.queued_count() == queued, prompt
        counts = {c.command: (c.today, c.total) for c in await db.refusals.counts()}
        assert counts == {"f": (len(EVASIONS), len(EVASIONS)), "wan": (1, 1)}

        stack.send(82, "/policy")
        assert await stack.reply_text(82) == "Only the bot's admins can do that."
        stack.send(1, "/policy")
        shown = await stack.reply_text(1)
        assert "gore" in shown and "behead*" in shown and "/wan" in shown
        assert f"/f: {len(EVASIONS)} today" in shown and "/wan: 1 today" in shown
        assert "lighthouse" not in shown  # counts, never prompts
        # Nothing of a refused prompt was stored anywhere either.
        async with db.pool.connection() as conn:
            cursor = await conn.execute("SELECT * FROM policy_refusals")
            rows = await cursor.fetchall()
        assert all("lighthouse" not in str(row) for row in rows)


async def test_again_and_the_reroll_button_check_the_policy_in_force_now(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(83, f"/f a storm over gore point {SMALL}")
        await stack.result(83)
    async with running_bot(fake_telegram, db, [fake_comfy], policy=RULES) as stack:
        stack.send(83, "/again")
        await fake_telegram.wait_for(
            lambda _: any(m.get("text") == REFUSED for m in fake_telegram.bot_messages(83))
        )
        assert len(await db.jobs.list_for_user(83)) == 1


async def test_spoilers_per_command_per_chat_and_per_user(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    rules = policy.from_table({"commands": {"wan": {"spoiler": True}}, "spoiler_chats": [-500]})
    async with running_bot(fake_telegram, db, [fake_comfy], policy=rules) as stack:
        stack.send(84, f"/f a plain fox {SMALL}")
        assert not _spoiled(await stack.result(84))
        # The command's spoiler wins over --file: a file could not be blurred.
        stack.send(84, f"/wan a fox running {SMALL} --file")
        video = await stack.result(84, method="sendVideo")
        assert _spoiled(video)
        # A chat with spoilers: every result there is blurred.
        stack.send(84, f"/f a fox in the group {SMALL}", chat_id=-500, chat_type="group")
        assert _spoiled(await stack.result(-500))
        # A user's own choice in /settings.
        stack.send(85, "/settings")
        call = await fake_telegram.wait_for_call("sendMessage", chat_id=85)
        keyboard = call.result["reply_markup"]["inline_keyboard"]
        data = next(
            b["callback_data"]
            for row in keyboard
            for b in row
            if b["text"].removeprefix("✓ ") == "spoiler"
        )
        query = fake_telegram.user_presses(85, call.result["message_id"], data)
        await fake_telegram.wait_for(lambda _: query in fake_telegram.callback_answers)
        assert (await db.users.settings(85)).get("spoiler") is True
        stack.send(85, f"/f my own fox {SMALL}")
        assert _spoiled(await stack.result(85))
        # Files are never blurred: the fake, like Telegram, ignores has_spoiler there.
        stack.send(85, f"/f my own file {SMALL} --file")
        document = await stack.result(85, method="sendDocument")
        assert "has_media_spoiler" not in document.result


async def test_a_workflow_of_its_own_can_ask_for_spoilers(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    shipped = workflow.shipped()["flux_schnell_full_text_to_image"]
    assert shipped.source is not None
    toml_text = shipped.source.read_text().replace(
        'command = "f"', 'command = "fs"\nspoiler = true'
    )
    graph = shipped.source.with_suffix(".json").read_text()
    await db.commands.add(workflow.loads("blurred", toml_text, graph), toml_text, graph)
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(86, f"/fs a fox {SMALL}")
        assert _spoiled(await stack.result(86))


async def test_comfyveil_submit_refuses_what_the_bot_refuses(db) -> None:
    settings = config.Settings(policy=RULES)
    try:
        await submit_cli.build_job(db, settings, "f", ["a", "ｇ\u200bore", "scene"], [], [])
    except policy.PromptRefused as exc:
        assert str(exc) == REFUSED
    else:
        raise AssertionError("the prompt was not refused")
    job = await submit_cli.build_job(db, settings, "f", ["a", "gorgeous", "scene"], [], [])
    assert job.params["prompt"] == "a gorgeous scene"
    assert [(c.command, c.total) for c in await db.refusals.counts()] == [("f", 1)]
