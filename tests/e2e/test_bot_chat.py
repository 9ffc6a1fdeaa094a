"""Issue 13: a chat experience people trust (every answer tied to its request, honest
status, no dead ends), one test or more per item, all through the fake Bot API."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import re

from comfyveil import config
from tests import zygote
from tests.e2e.bot_support import SMALL, running_bot
from tests.fakes.comfyui import DEFAULT_MODELS, FakeComfyUI
from tests.fakes.telegram import FakeTelegram

SCHNELL_GONE = {
    folder: [f for f in files if "schnell" not in f] for folder, files in DEFAULT_MODELS.items()
}


def _set_models(fake: FakeComfyUI, models: dict[str, list[str]]) -> None:
    """Change what the fake has installed without the pool noticing (it reads /object_info
    once every few minutes): the change is discovered only when a prompt is posted."""
    fake.models = copy.deepcopy(models)
    fake._node_defs = fake._build_object_info()


async def _ended(db, count: int, timeout: float = 15.0) -> None:
    """Wait until `count` jobs have ended (whatever the chat shows of it)."""

    async def ended() -> int:
        async with db.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) AS n FROM jobs WHERE finished_at IS NOT NULL"
            )
            row = await cursor.fetchone()
        return int(row["n"])

    async with asyncio.timeout(timeout):
        while await ended() < count:
            await asyncio.sleep(0.05)


# --- 1. refused jobs don't cost quota ------------------------------------------------------


async def test_a_job_failed_by_the_gpu_side_gives_its_quota_back(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    fake = await fake_comfy_factory(models=copy.deepcopy(DEFAULT_MODELS))
    limits = config.LimitsConfig(daily_quota=1)
    async with running_bot(fake_telegram, db, [fake], limits=limits) as stack:
        _set_models(fake, SCHNELL_GONE)  # the model vanished after the pool read the list
        stack.send(50, f"/f a fox {SMALL}")
        await _ended(db, 1)
        assert any(r.path.endswith("/prompt") and r.method == "POST" for r in fake.requests)
        _set_models(fake, DEFAULT_MODELS)
        stack.send(50, f"/f a fox {SMALL}")
        photo = await stack.result(50, timeout=15)  # not "you have used all 1 job"
        assert photo.result["caption"]


async def test_a_command_refused_for_want_of_a_model_costs_no_quota(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    fake = await fake_comfy_factory(models=copy.deepcopy(SCHNELL_GONE))
    limits = config.LimitsConfig(daily_quota=1)
    async with running_bot(fake_telegram, db, [fake], limits=limits) as stack:
        for n in range(2):
            stack.send(51, f"/f a fox {SMALL}")
            text = await _said(fake_telegram, 51, "model", count=n + 1)
            assert "quota" not in text
        _set_models(fake, DEFAULT_MODELS)
        await _reread_models(stack)
        stack.send(51, f"/f a fox {SMALL}")
        photo = await stack.result(51, timeout=15)
        assert photo.result["caption"]


async def _reread_models(stack) -> None:
    for backend in stack.pool.backends.values():
        backend.object_info = None
        await stack.pool.probe(backend)


async def _said(
    telegram: FakeTelegram, chat: int, wanted: str, *, count: int = 1, timeout: float = 15.0
) -> str:
    """The `count`-th text sent or edited into `chat` that contains `wanted`."""

    def found() -> list[str]:
        return [
            str(c.params["text"])
            for c in telegram.sent
            if str(c.params.get("chat_id")) == str(chat)
            and c.method in ("sendMessage", "editMessageText")
            and wanted in str(c.params.get("text", ""))
        ]

    await telegram.wait_for(lambda _: len(found()) >= count, timeout=timeout)
    return found()[count - 1]


# --- 2. only what can run is advertised -------------------------------------------------


async def test_commands_no_gpu_can_run_are_not_offered(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    fake = await fake_comfy_factory(models=copy.deepcopy(SCHNELL_GONE))
    async with running_bot(fake_telegram, db, [fake], admins=(1,)) as stack:
        menu = [c["command"] for c in next(iter(fake_telegram.commands.values()))]
        assert "f" not in menu and "fd" in menu and "help" in menu
        stack.send(52, "/start")
        start = await stack.reply_text(52)
        assert "Try /" in start and "Try /f " not in start
        stack.send(52, "/help")
        help_text = await stack.reply_text(52, count=2)
        line = next(x for x in help_text.splitlines() if x.startswith("/f "))
        assert line.endswith("not available right now")
        assert "/f a fox" not in help_text  # the footer's example is a command that runs
        stack.send(52, f"/f a fox {SMALL}")
        assert await stack.reply_text(52, count=3) == (
            "/f is not available right now: no GPU has its model."
        )
        assert await stack.queued_count() == 0
        stack.send(1, "/workflows")
        admin = await stack.reply_text(1)
        line = next(x for x in admin.splitlines() if x.startswith("/f "))
        assert "flux1-schnell.safetensors" in line  # the whole file name, for the admin
        # The model is installed: the menu offers /f again without a restart.
        _set_models(fake, DEFAULT_MODELS)
        await _reread_models(stack)
        await fake_telegram.wait_for(
            lambda _: "f" in [c["command"] for c in next(iter(fake_telegram.commands.values()))],
            timeout=5,
        )


def _age_model_lists(stack, seconds: float) -> None:
    """As if the pool last read each backend's lists `seconds` ago."""
    for backend in stack.pool.backends.values():
        backend.capabilities_at -= seconds


async def test_a_model_installed_on_a_gpu_is_used_at_once_not_after_minutes(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    """The pool reads a GPU's model lists every few minutes; a job refused for want of a
    model makes it read them again first (when the last read is more than a few seconds
    old), so a model just installed is not refused for minutes."""
    fake = await fake_comfy_factory(models=copy.deepcopy(SCHNELL_GONE))
    async with running_bot(fake_telegram, db, [fake]) as stack:
        stack.send(57, f"/f a fox {SMALL}")
        assert (await stack.reply_text(57)).startswith("/f is not available right now")
        _set_models(fake, DEFAULT_MODELS)  # an operator ran `comfyveil models install f`
        _age_model_lists(stack, 10.0)
        stack.send(57, f"/f a fox {SMALL}")
        photo = await stack.result(57)
        assert photo.result["caption"]


async def test_an_admins_backends_reads_the_model_lists_again(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    fake = await fake_comfy_factory(models=copy.deepcopy(SCHNELL_GONE))
    async with running_bot(fake_telegram, db, [fake], admins=(1,), worker=False) as stack:
        _set_models(fake, DEFAULT_MODELS)
        _age_model_lists(stack, 2.0)
        stack.send(1, "/backends")
        await stack.reply_text(1)
        stack.send(58, "/help")
        help_text = await stack.reply_text(58)
        line = next(x for x in help_text.splitlines() if x.startswith("/f "))
        assert not line.endswith("not available right now"), line


async def test_a_photo_without_a_command_gets_a_hint_naming_an_edit_command_that_runs(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    from tests.e2e.bot_support import png

    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(53, photo=png())
        hint = await stack.reply_text(53)
        assert "/qwen make it night" in hint


async def test_the_photo_hint_names_an_edit_without_words_when_that_is_what_runs(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    """No GPU has /qwen's model, but the operator's /invert (no prompt, no model) runs:
    the hint names it, not "no command that edits photos can run" (issue 23 item 7)."""
    from pathlib import Path

    from comfyveil.comfy import workflow
    from tests.e2e.bot_support import png

    data = Path(__file__).parents[1] / "data" / "workflows"
    toml_text = (data / "invert.toml").read_text()
    graph = (data / "invert.json").read_text()
    await db.commands.add(workflow.loads("invert", toml_text, graph), toml_text, graph)
    bare = await fake_comfy_factory(models={"diffusion_models": [], "text_encoders": [],
                                            "vae": [], "checkpoints": [], "loras": []})
    async with running_bot(fake_telegram, db, [bare]) as stack:
        stack.send(54, photo=png())
        hint = await stack.reply_text(54)
        assert "/invert" in hint and "/qwen" not in hint, hint
        assert "No command that edits photos" not in hint


# --- 3. results answer their request ------------------------------------------------------

BOT = "@ComfyveilTestBot"


async def test_in_a_group_each_result_answers_its_command_and_names_who_asked(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        alice = stack.send(
            60,
            f"/f{BOT} a red fox --seed 5 {SMALL}",
            chat_id=-700,
            chat_type="group",
            first_name="Alice",
        )
        bob = stack.send(
            61, f"/f{BOT} a blue bird {SMALL}", chat_id=-700, chat_type="group", first_name="Bob"
        )
        await stack.result(-700, count=2)
        photos = {
            p.result["reply_to_message"]["message_id"]: p.result["caption"]
            for p in fake_telegram.calls("sendPhoto")
        }
        assert set(photos) == {alice["message_id"], bob["message_id"]}
        first, prompt = photos[alice["message_id"]].split("\n")
        assert first.startswith("/f · seed 5 · ") and first.endswith(" · for Alice")
        assert prompt == "a red fox"
        assert photos[bob["message_id"]].endswith("for Bob\na blue bird")


async def test_a_long_prompt_is_shortened_in_the_caption_at_a_word_end(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        prompt = " ".join(f"word{i}" for i in range(200))  # about 1 500 characters
        request = stack.send(62, f"/f {prompt} --seed 9 {SMALL}")
        photo = await stack.result(62)
        caption = photo.result["caption"]
        assert photo.result["reply_to_message"]["message_id"] == request["message_id"]
        head, shown = caption.split("\n")
        assert head.startswith("/f · seed 9 · ")
        assert len(caption) <= 1024 and len(caption) > 1000
        assert shown.endswith("…")
        assert prompt.startswith(shown[:-1]) and prompt[len(shown) - 1] == " "


# --- 4. an honest status message --------------------------------------------------------

STEP = re.compile(r"^Running on gpu0 · (\d+)% · step (\d+)/(\d+) · (\d+) s$")


def _status_texts(telegram: FakeTelegram, chat: int, message_id: int) -> list[str]:
    texts = []
    for call in telegram.sent:
        if not call.ok or str(call.params.get("chat_id")) != str(chat):
            continue
        sent = call.method == "sendMessage" and call.result["message_id"] == message_id
        edited = call.method == "editMessageText" and int(call.params["message_id"]) == message_id
        if sent or edited:
            texts.append(call.result["text"])
    return texts


async def test_status_shows_steps_percent_and_time_and_its_cancel_button_works(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    fake = await fake_comfy_factory(step_delay=0.6)
    async with running_bot(fake_telegram, db, [fake]) as stack:
        stack.send(63, f"/f a fox --steps 8 {SMALL}")
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=63)
        message_id = status.result["message_id"]
        buttons = status.result["reply_markup"]["inline_keyboard"][0]
        assert [b["text"] for b in buttons] == ["✖ Cancel"]

        def stepping(_: object) -> re.Match[str] | None:
            return next(
                (m for t in _status_texts(fake_telegram, 63, message_id) if (m := STEP.match(t))),
                None,
            )

        found = await fake_telegram.wait_for(stepping, timeout=15)
        assert found[3] == "8" and 0 < int(found[2]) <= 8
        assert int(found[1]) == round(100 * int(found[2]) / 8)
        shown = fake_telegram.messages(63)
        assert any(m["message_id"] == message_id and "reply_markup" in m for m in shown)
        # Someone else's press does nothing; the owner's cancels.
        other = fake_telegram.user_presses(64, message_id, buttons[0]["callback_data"], chat_id=63)
        answer = await fake_telegram.wait_for(
            lambda calls: next(
                (
                    c
                    for c in calls
                    if c.method == "answerCallbackQuery"
                    and c.params.get("callback_query_id") == other
                ),
                None,
            )
        )
        assert answer.params["text"] == "Only the one who asked for this job can cancel it."
        assert "Cancelled." not in _status_texts(fake_telegram, 63, message_id)
        fake_telegram.user_presses(63, message_id, buttons[0]["callback_data"])
        await fake_telegram.wait_for(
            lambda _: "Cancelled." in _status_texts(fake_telegram, 63, message_id), timeout=15
        )
        assert not fake_telegram.calls("sendPhoto")


async def test_status_never_goes_backwards_in_a_burst(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    fake = await fake_comfy_factory(step_delay=0.15)
    async with running_bot(fake_telegram, db, [fake]) as stack:
        for user in range(70, 74):
            stack.send(user, f"/f a fox --steps 4 {SMALL}")
        for user in range(70, 74):
            await stack.result(user, timeout=30)
        stage_of = {
            "Queued": 0,
            "Starting": 0,
            "Waiting": 1,
            "Sent to": 2,
            "Next on": 2,
            "Running": 3,
        }
        for user in range(70, 74):
            first = next(
                c
                for c in fake_telegram.calls("sendMessage")
                if str(c.params["chat_id"]) == str(user)
            )
            texts = _status_texts(fake_telegram, user, first.result["message_id"])
            stages = [next(n for word, n in stage_of.items() if t.startswith(word)) for t in texts]
            assert stages == sorted(stages), texts


async def test_after_a_restart_the_status_message_is_kept_current(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    fake = await fake_comfy_factory(step_delay=0.5)
    async with running_bot(fake_telegram, db, [fake], worker=False) as stack:
        stack.send(65, f"/f a fox --steps 8 {SMALL}")
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=65)
        message_id = status.result["message_id"]
        assert status.result["text"].startswith(("Queued", "Starting"))
    async with running_bot(fake_telegram, db, [fake]) as stack:  # a new process
        await fake_telegram.wait_for(
            lambda _: any(
                t.startswith("Running on gpu0")
                for t in _status_texts(fake_telegram, 65, message_id)
            ),
            timeout=15,
        )
        photo = await stack.result(65, timeout=20)
        await fake_telegram.wait_for(lambda _: message_id in fake_telegram.deleted(65))
        assert (
            photo.result["reply_to_message"]["message_id"]
            == status.result["reply_to_message"]["message_id"]
        )


# --- 5. every GPU offline --------------------------------------------------------------

ALL_OFFLINE = "All GPUs are offline; your job runs when one is back — /cancel to drop it."


async def test_with_every_gpu_offline_users_and_admins_are_told_and_jobs_give_up(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], admins=(1,)) as stack:
        stack.worker.options = dataclasses.replace(stack.worker.options, max_wait_offline=3.0)
        # what `comfyveil run` gives both from [worker] max_wait_offline
        stack.bot.settings = dataclasses.replace(stack.bot.settings, worker=dataclasses.replace(
            stack.bot.settings.worker, max_wait_offline=3.0))
        stack.bot.offline_notice_after = 0.2
        stack.send(1, "/backends")  # the admin has a chat with the bot
        await stack.reply_text(1)
        await fake_comfy.kill()
        await fake_telegram.wait_for(lambda _: not stack.pool.any_healthy, timeout=10)
        stack.send(66, f"/f a fox {SMALL}")
        assert await _said(fake_telegram, 66, "offline") == ALL_OFFLINE
        notice = await stack.reply_text(1, count=2)
        assert notice.startswith("All GPUs are offline (gpu0).")
        # The admin and the user read one wait (issue 23 item 15: "up to 1 min" against 25 s).
        assert "each up to 3 s;" in notice, notice
        ended = await _said(fake_telegram, 66, "dropped", timeout=15)
        assert ended == (
            "No GPU came back online within 3 seconds, so the job was dropped; "
            "send the command again later."
        )
        stack.send(67, f"/f a fox {SMALL}")
        await _said(fake_telegram, 67, "offline")
        admin_messages = [
            c for c in fake_telegram.calls("sendMessage") if str(c.params["chat_id"]) == "1"
        ]
        assert len(admin_messages) == 2  # /backends' answer, and told once per outage


# --- 6. buttons that fit -----------------------------------------------------------------


def _buttons(call) -> list[str]:
    markup = call.result.get("reply_markup") or {"inline_keyboard": [[]]}
    return [b["text"] for row in markup["inline_keyboard"] for b in row]


async def test_result_buttons_fit_the_result(fake_telegram: FakeTelegram, fake_comfy, db) -> None:
    from pathlib import Path

    from comfyveil.comfy import workflow
    from tests.e2e.bot_support import png

    await db.commands.seed(
        [workflow.load(Path(__file__).parents[1] / "data" / "workflows" / "invert.toml")]
    )
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(80, photo=png(), caption="/invert")
        inverted = await stack.result(80)
        # No seed: another run would give the same image, so no re-roll.
        assert _buttons(inverted) == ["✏️ Edit this", "📄 As file"]
        pressed = fake_telegram.user_presses(
            80,
            inverted.result["message_id"],
            inverted.result["reply_markup"]["inline_keyboard"][0][0]["callback_data"],
        )
        answer = await fake_telegram.wait_for(
            lambda calls: next(
                (
                    c
                    for c in calls
                    if c.method == "answerCallbackQuery"
                    and c.params.get("callback_query_id") == pressed
                ),
                None,
            )
        )
        assert "/qwen" in answer.params["text"] and "/invert" not in answer.params["text"]
        stack.send(80, f"/f a fox --file {SMALL}")
        document = await stack.result(80, method="sendDocument")
        assert _buttons(document) == ["🎲 Re-roll", "✏️ Edit this"]  # a file already
        stack.send(80, f"/f a fox {SMALL}")
        photo = await stack.result(80, count=2)
        assert _buttons(photo) == ["🎲 Re-roll", "✏️ Edit this", "📄 As file"]


# --- 7. buttons answer only the user they were for -----------------------------------------


async def _answer(telegram: FakeTelegram, query_id: str) -> str:
    call = await telegram.wait_for(
        lambda calls: next(
            (
                c
                for c in calls
                if c.method == "answerCallbackQuery"
                and c.params.get("callback_query_id") == query_id
            ),
            None,
        )
    )
    return str(call.params.get("text"))


async def test_in_a_group_only_the_owner_of_a_settings_message_can_press_its_buttons(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(90, f"/settings{BOT}", chat_id=-900, chat_type="group")
        shown = await fake_telegram.wait_for_call("sendMessage", chat_id=-900)
        keyboard = shown.result["reply_markup"]["inline_keyboard"]
        wide = next(b for row in keyboard for b in row if b["text"] == "16:9")
        other = fake_telegram.user_presses(
            91, shown.result["message_id"], wide["callback_data"], chat_id=-900
        )
        assert await _answer(fake_telegram, other) == (
            "These buttons are for the one who sent the command; send it yourself."
        )
        assert not fake_telegram.calls("editMessageText")
        intruder = await db.users.get(91)
        assert intruder is None or "ar" not in intruder.settings
        mine = fake_telegram.user_presses(
            90, shown.result["message_id"], wide["callback_data"], chat_id=-900
        )
        assert await _answer(fake_telegram, mine) == "Saved."
        owner = await db.users.get(90)
        assert owner is not None and owner.settings["ar"] == "16:9"


# --- 8. stopping -----------------------------------------------------------------------


async def test_sigterm_hands_running_jobs_back_fast_and_answers_commands_until_the_end(
    fake_telegram: FakeTelegram, fake_comfy_factory, database_url: str, tmp_path, db
) -> None:
    import signal
    import time

    from tests.e2e.test_bot_run_cli import _env

    fake = await fake_comfy_factory(step_delay=1.0)
    conf = tmp_path / "comfyveil.toml"
    conf.write_text(
        f'data_dir = "{tmp_path}"\n'
        f'[database]\nurl = "{database_url}"\n'
        f'[telegram]\napi_url = "{fake_telegram.url}"\nopen = true\npoll_timeout = 1\n'
        "status_delay = 0\n"
        f"[worker]\nstop_grace = 1.5\n"
        f'[[backends]]\nname = "gpu0"\nurl = "{fake.url}"\nvia = "direct"\n'
    )
    proc = await zygote.comfyveil(
        "run",
        "--config",
        str(conf),
        env=_env(COMFYVEIL_TELEGRAM_TOKEN=fake_telegram.token),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)  # type: ignore[union-attr]
        assert b"is running" in line
        fake_telegram.user_sends(85, f"/f a fox --steps 8 {SMALL}")  # about 8 s on the GPU
        await _said(fake_telegram, 85, "Running on gpu0", timeout=20)
        proc.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        fake_telegram.user_sends(86, "/help")  # still answered while it stops
        await stack_reply(fake_telegram, 86)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        took = time.monotonic() - stopped_at
        assert proc.returncode == 0, err.decode()[-2000:]
        assert took < 6.0  # within stop_grace (1.5 s) and the closing, not 30 s
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert not fake.interrupts  # the prompt kept running on its GPU
    async with running_bot(fake_telegram, db, [fake]) as stack:  # the next process
        await stack.result(85, timeout=30)
    assert len(fake.prompts) == 1  # re-attached, not run twice


async def stack_reply(telegram: FakeTelegram, chat: int) -> str:
    call = await telegram.wait_for_call("sendMessage", chat_id=chat, timeout=10)
    return str(call.result["text"])


# --- 9. rough edges ---------------------------------------------------------------------


async def test_plurals_and_a_bad_job_id_read_right(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    limits = config.LimitsConfig(daily_quota=1, max_queued=1)
    async with running_bot(fake_telegram, db, [fake_comfy], limits=limits, admins=(1,)) as stack:
        stack.send(100, "/cancel #zzzz")
        assert await stack.reply_text(100) == (
            "#zzzz is not a job id: write # and the id /status shows, such as /cancel #3f2a9c1d."
        )
        stack.send(100, "/cancel #3f2a9c1d")
        assert await stack.reply_text(100, count=2) == (
            "None of your jobs has the id #3f2a9c1d; /status lists yours."
        )
        stack.send(100, f"/f one {SMALL}")
        await stack.result(100)
        stack.send(100, f"/f two {SMALL}")
        assert await _said(fake_telegram, 100, "quota") == (
            "You have used the 1 job of your daily quota; try again after 00:00 UTC."
        )
        stack.send(1, "/quota 100 1")
        assert await stack.reply_text(1) == "User 100 may run 1 job a day."


async def test_raw_comfyui_errors_reach_admins_only(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy], admins=(1,)) as stack:
        fake_comfy.fail_next_execution(
            "KSampler", message="**** ERROR: disk quota exceeded", exception_type="OSError"
        )
        stack.send(101, f"/f a fox {SMALL}")
        user_sees = await _said(fake_telegram, 101, "GPU", timeout=15)
        assert user_sees == "The workflow failed on the GPU; please try again later."
        fake_comfy.fail_next_execution(
            "KSampler", message="**** ERROR: disk quota exceeded", exception_type="OSError"
        )
        stack.send(1, f"/f a fox {SMALL}")
        admin_sees = await _said(fake_telegram, 1, "GPU", timeout=15)
        assert admin_sees.startswith("The workflow failed on the GPU; please try again later.")
        assert "disk quota exceeded" in admin_sees and "KSampler" in admin_sees


async def test_a_prompt_over_the_workflows_own_limit_is_told_that_limit(
    fake_telegram: FakeTelegram, fake_comfy, db
) -> None:
    limits = config.LimitsConfig(max_prompt_length=5000)
    async with running_bot(fake_telegram, db, [fake_comfy], limits=limits) as stack:
        stack.send(102, "/f " + "x" * 2500)
        assert await stack.reply_text(102) == (
            "The prompt is 2500 characters long; the limit is 2000."
        )


async def test_files_keep_their_names_and_a_status_telegram_will_not_delete_says_done(
    fake_telegram: FakeTelegram, fake_comfy, db, tmp_path
) -> None:
    import json
    from pathlib import Path

    from comfyveil.comfy import workflow
    from tests.e2e.bot_support import png

    data = Path(__file__).parents[1] / "data" / "workflows"
    graph = json.loads((data / "invert.json").read_text())
    graph["3"]["inputs"]["filename_prefix"] = "comfyveil/my cat ë"
    (tmp_path / "catinvert.json").write_text(json.dumps(graph))
    (tmp_path / "catinvert.toml").write_text(
        (data / "invert.toml").read_text().replace('command = "invert"', 'command = "catinvert"')
    )
    await db.commands.seed([workflow.load(tmp_path / "catinvert.toml")])
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(103, photo=png(), caption="/catinvert --file")
        document = await stack.result(103, method="sendDocument")
        assert document.result["document"]["file_name"] == "my cat ë_00001_.png"
        await fake_telegram.wait_for(lambda _: fake_telegram.deleted(103))
        # Telegram refuses to delete the status message (429, again and again).
        fake_comfy.set_delay("ImageInvert", 2.5)
        for _ in range(4):  # PTB's rate limiter tries 3 more times
            fake_telegram.fail_next(
                "deleteMessage", 429, "Too Many Requests: retry after 1", {"retry_after": 1}
            )
        stack.send(103, photo=png(color=(10, 200, 10)), caption="/catinvert")  # not cached
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=103, count=2)
        await stack.result(103)
        await fake_telegram.wait_for(
            lambda _: "Done." in _status_texts(fake_telegram, 103, status.result["message_id"]),
            timeout=15,
        )


# --- 10. Telegram's limits at scale -----------------------------------------------------


async def test_under_telegrams_limits_results_go_first_and_status_edits_give_way(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    from collections import Counter

    from comfyveil.comfy import pool
    from comfyveil.telegram import app, limits
    from comfyveil.worker import Worker
    from tests.e2e.bot_support import WORKER, settings_for
    from tests.fakes.telegram import Limits

    # Telegram's rules scaled down (6 messages a second overall) so a few GPUs overrun them.
    fake_telegram.enforce_limits(Limits(overall=6))
    gpus = [await fake_comfy_factory(step_delay=0.1) for _ in range(3)]
    users = list(range(2000, 2024))
    settings = settings_for(fake_telegram, gpus)
    await db.commands.seed()
    limiter = limits.ChatRateLimiter(overall=5)
    async with pool.Pool(settings.backend_list(), probe_interval=0.2) as backends:
        bot = app.TelegramBot(
            settings, db, pool=backends, status_interval=0.2, rate_limiter=limiter
        )
        worker = Worker(db, backends, sinks=[bot.sink], options=WORKER)
        await bot.start()
        task = asyncio.create_task(worker.run())
        try:
            for user in users:
                fake_telegram.user_sends(user, f"/f user {user} --steps 6 {SMALL}")
            await fake_telegram.wait_for(
                lambda calls: len([c for c in calls if c.method == "sendPhoto" and c.ok]) >= 24,
                timeout=90,
            )
        finally:
            await bot.stop_updates()
            worker.stop()
            await asyncio.wait_for(task, 30)
            await bot.close()
    photos = Counter(int(c.params["chat_id"]) for c in fake_telegram.calls("sendPhoto"))
    assert photos == Counter({user: 1 for user in users})  # every result, once
    refused = [c.method for c in fake_telegram.limited]
    assert not [m for m in refused if m.startswith("send")], refused  # no 429 on a message
    assert limiter.shed > 0  # status traffic gave way instead


# Three runs of /f on gpu0 of 8 steps at 256x256, a minute each, their results delivered
# long ago.
PAST_RUNS = """
WITH past AS (
    INSERT INTO jobs (id, user_id, chat_id, command, workflow_hash, params, status,
                      submitted, backend, attempts, created_at, started_at, finished_at,
                      updated_at)
    SELECT gen_random_uuid(), 109, 109, 'f', 'old',
           '{"steps": 8, "width": 256, "height": 256}'::jsonb, 'succeeded', true, 'gpu0',
           1, now() - make_interval(mins => g + 2), now() - make_interval(mins => g + 1),
           now() - make_interval(mins => g), now() - make_interval(mins => g)
    FROM generate_series(1, 3) AS g
    RETURNING id
)
INSERT INTO deliveries (job_id, sink) SELECT id, 'telegram' FROM past
"""


async def test_a_queued_jobs_eta_counts_what_the_running_job_still_needs(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    # /f of 8 steps has taken 60 s on gpu0 each time: the job running there still needs
    # most of its run, however loaded this machine is, when the next one is queued.
    async with db.pool.connection() as conn:
        await conn.execute(PAST_RUNS)
    fake = await fake_comfy_factory(step_delay=3.0)
    async with running_bot(fake_telegram, db, [fake]) as stack:
        stack.send(111, f"/f a cat --steps 8 {SMALL}")  # 24 s on the fake
        # (On the GPU itself: the chat's "Running" edit may come seconds later under load.)
        async with asyncio.timeout(15):
            while fake.running is None:
                await asyncio.sleep(0.02)
        stack.send(112, f"/f a dog --steps 6 {SMALL}")  # behind it
        queued = await _said(fake_telegram, 112, "about", timeout=15)
        shown = re.search(r"about ([\d.]+) (s|min)", queued)
        assert shown, queued
        seconds = float(shown[1]) * (60 if shown[2] == "min" else 1)
        # Its own 45 s (6 steps of the 8 that took 60 s) and what the running job still
        # needs (its 60 s estimate less the seconds it ran, or once its steps show, its
        # steps left at their 3 s): not its own 45 s alone.
        assert seconds >= 50, queued
