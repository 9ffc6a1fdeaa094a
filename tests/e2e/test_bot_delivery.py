"""Results that cannot be delivered end after a few tries and never hold up the others;
a group that became a supergroup gets its result in the new chat; jobs queued from the
command line never go to Telegram."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest

from comfyveil.cli import submit
from comfyveil.comfy import pool, workflow
from comfyveil.store import database, jobs
from comfyveil.telegram import app
from comfyveil.worker import Worker
from tests.e2e.bot_support import SMALL, WORKER, running_bot, settings_for
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram
from tests.integration.worker_support import wait_for

pytestmark = pytest.mark.timeout(120)

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16  # Telegram refuses it as a photo: sent as a file
CATCH_UP = dataclasses.replace(WORKER, delivery_grace=0.0)


async def finished_elsewhere(
    db: database.Database, chat_id: int, new: jobs.NewJob | None = None
) -> jobs.Job:
    """A job a worker without a Telegram sink (another host) ran and finished."""
    await db.commands.seed()
    if new is None:
        wf = workflow.find("f")
        values = wf.validate({"prompt": "a fox", "steps": 2, "width": 256, "height": 256})
        new = jobs.NewJob(
            user_id=abs(chat_id), chat_id=chat_id, command="f", workflow_hash=wf.hash, params=values
        )
    queued = await db.jobs.enqueue(new)
    claimed = await db.jobs.claim("gpu-host-worker")
    assert claimed is not None and claimed.id == queued.id
    return await db.jobs.complete(claimed, [jobs.Output("fox.png", "image", "image/png", PNG)])


@contextlib.asynccontextmanager
async def bot_catching_up(
    telegram: FakeTelegram, db: database.Database, comfy: FakeComfyUI, options=CATCH_UP,
    *, down_at_start: bool = False,
) -> AsyncIterator[app.TelegramBot]:
    """The bot's process: the bot and its worker, whose catch-up delivers at once.
    `down_at_start`: the Bot API answered getMe with 500, so the bot is not started yet
    (the worker runs all the same)."""
    settings = settings_for(telegram, [comfy])
    async with pool.Pool(settings.backend_list(), probe_interval=0.2) as backends:
        bot = app.TelegramBot(settings, db, pool=backends, status_interval=0.2)
        worker = Worker(db, backends, sinks=[bot.sink], options=options)
        if down_at_start:
            telegram.fail_next("getMe", 500, "Internal Server Error")
            with pytest.raises(app.BotApiUnreachable):
                await bot.start()
        else:
            await bot.start()
        task = asyncio.create_task(worker.run(), name="bot-worker")
        try:
            yield bot
        finally:
            await bot.stop_updates()
            worker.stop()
            await asyncio.wait_for(task, 30)
            await bot.close()


def _to(chat_id: int, ok: bool | None = True):
    def found(calls) -> list:
        return [
            c
            for c in calls
            if str(c.params.get("chat_id")) == str(chat_id)
            and (ok is None or c.ok == ok)
            and c.method != "getUpdates"
        ]

    return found


async def test_a_hundred_undeliverable_results_do_not_hold_up_the_next_one(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    gone = [await finished_elsewhere(db, 10_000 + i) for i in range(110)]  # chat not found
    for i in range(10):
        fake_telegram.open_chat(20_000 + i)
        fake_telegram.block_bot(20_000 + i)
        gone.append(await finished_elsewhere(db, 20_000 + i))
        fake_telegram.open_chat(-30_000 - i, "group")
        fake_telegram.kick_bot(-30_000 - i)
        gone.append(await finished_elsewhere(db, -30_000 - i))
    fake_telegram.open_chat(555)
    wanted = await finished_elsewhere(db, 555)
    parked = dataclasses.replace(CATCH_UP, delivery_backoff=600.0)  # no second try here
    async with bot_catching_up(fake_telegram, db, fake_comfy, parked):
        sent = await fake_telegram.wait_for_call("sendDocument", chat_id=555, timeout=30)
        assert sent.files["document"][1] == PNG
        await wait_for(
            lambda: _is(db.jobs.delivery_outcome(wanted.id, "telegram"), jobs.DELIVERED), timeout=10
        )
    for job in gone:  # each was tried, and is not up for another try before its delay
        assert _to(job.chat_id, ok=False)(fake_telegram.sent), job.chat_id
    assert await db.jobs.undelivered("telegram") == []


async def test_an_undeliverable_result_is_tried_a_few_times_then_given_up(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    fake_telegram.open_chat(42)
    fake_telegram.block_bot(42)
    blocked = await finished_elsewhere(db, 42)
    missing = await finished_elsewhere(db, 43)
    quick = dataclasses.replace(CATCH_UP, delivery_backoff=0.05, delivery_refused_tries=3)
    async with bot_catching_up(fake_telegram, db, fake_comfy, quick):
        for job in (blocked, missing):
            await wait_for(
                lambda job=job: _is(db.jobs.delivery_outcome(job.id, "telegram"), jobs.FAILED),
                timeout=20,
            )
    for chat in (42, 43):
        refused = _to(chat, ok=False)(fake_telegram.sent)
        assert len(refused) == 3, [c.error for c in refused]
        assert not _to(chat)(fake_telegram.sent)
    assert {c.error for c in _to(42, ok=False)(fake_telegram.sent)} == {
        "Forbidden: bot was blocked by the user"
    }
    assert {c.error for c in _to(43, ok=False)(fake_telegram.sent)} == {
        "Bad Request: chat not found"
    }
    assert await db.jobs.undelivered("telegram") == []


async def test_a_group_upgraded_to_a_supergroup_gets_its_result_there(
    fake_telegram: FakeTelegram, fake_comfy_factory, db: database.Database
) -> None:
    fake = await fake_comfy_factory(step_delay=0.3)
    async with running_bot(fake_telegram, db, [fake]) as stack:
        stack.send(
            13, f"/f@ComfyveilTestBot a fox --steps 6 {SMALL}", chat_id=-500, chat_type="group"
        )
        await wait_for(lambda: _now(fake.running is not None), timeout=15, interval=0.02)
        fake_telegram.migrate_group(-500, -1_001_000_000_500, by_user=13)
        photo = await stack.result(-1_001_000_000_500, timeout=20)
    assert photo.result["chat"]["type"] == "supergroup"
    assert photo.result["caption"].startswith("/f")
    assert not _to(-500)(fake_telegram.calls("sendPhoto"))


async def test_a_job_queued_from_the_command_line_never_goes_to_telegram(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    await db.commands.seed()
    settings = settings_for(fake_telegram, [fake_comfy])
    new = await submit.build_job(db, settings, "f", ["a", "fox"], ["steps=2"], [])
    job = await finished_elsewhere(db, new.chat_id, new)
    async with bot_catching_up(fake_telegram, db, fake_comfy):
        await wait_for(
            lambda: _is(db.jobs.delivery_outcome(job.id, "telegram"), jobs.SKIPPED), timeout=10
        )
    assert not _to(jobs.NO_CHAT, ok=None)(fake_telegram.sent)


async def _is(pending, wanted: str) -> bool:
    return await pending == wanted


async def _now(value: bool) -> bool:
    return value


async def test_a_result_finished_while_telegram_was_down_at_start_is_sent_once_it_answers(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database
) -> None:
    """The service started while the Bot API answered 500: its worker found a result to
    deliver before the bot could connect. It waits for the bot's next try, and is sent
    once (it used to be a failed try, then half a minute's wait)."""
    fake_telegram.open_chat(556)
    waiting = await finished_elsewhere(db, 556)
    async with bot_catching_up(fake_telegram, db, fake_comfy, down_at_start=True) as bot:
        await asyncio.sleep(1.0)  # the catch-up took it and waits for the bot
        assert not _to(556)(fake_telegram.sent)
        starting = asyncio.create_task(bot.start_when_reachable(first_delay=0.5))
        try:
            await fake_telegram.wait_for_call("sendDocument", chat_id=556, timeout=15)
            await wait_for(
                lambda: _is(db.jobs.delivery_outcome(waiting.id, "telegram"), jobs.DELIVERED),
                timeout=10,
            )
            assert len(_to(556)(fake_telegram.sent)) == 1
        finally:
            await starting


async def test_a_result_that_gave_up_waiting_for_the_bot_is_sent_as_soon_as_it_starts(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Telegram down as the service started, for longer than a result waits for the bot
    (15 s; 0.3 s here, so the test does not take 15 s): the result's try failed and
    earned the default delay (30 s). It is sent as soon as the bot starts instead."""
    from comfyveil.telegram import sink

    monkeypatch.setattr(sink, "CONNECT_WAIT", 0.3)
    fake_telegram.open_chat(559)
    waiting = await finished_elsewhere(db, 559)
    async with bot_catching_up(fake_telegram, db, fake_comfy, down_at_start=True) as bot:
        await asyncio.sleep(2.0)  # the catch-up's try gave up waiting for the bot
        assert not _to(559)(fake_telegram.sent)
        await bot.start()
        started = asyncio.get_running_loop().time()
        await fake_telegram.wait_for_call("sendDocument", chat_id=559, timeout=15)
        assert asyncio.get_running_loop().time() - started < 10
        await wait_for(
            lambda: _is(db.jobs.delivery_outcome(waiting.id, "telegram"), jobs.DELIVERED),
            timeout=10,
        )
        assert len(_to(559)(fake_telegram.sent)) == 1


async def test_telegram_failing_a_result_is_logged_in_one_line_not_as_an_internal_error(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 500 from the Bot API on a result is Telegram's outage, not a bug of ours: one
    warning line naming it, no traceback, and the result is tried again later."""
    import logging

    fake_telegram.open_chat(557)
    failing = await finished_elsewhere(db, 557)
    fake_telegram.fail_next("sendDocument", 500, "Internal Server Error")
    parked = dataclasses.replace(CATCH_UP, delivery_backoff=600.0)  # no second try here
    with caplog.at_level(logging.WARNING, logger="comfyveil.worker"):
        async with bot_catching_up(fake_telegram, db, fake_comfy, parked):
            await wait_for(lambda: _now(bool(_failures(caplog))), timeout=20)
    (record,) = _failures(caplog)
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "Telegram could not be reached (NetworkError)" in record.getMessage()
    assert await db.jobs.delivery_outcome(failing.id, "telegram") is None  # tried again later


def _failures(caplog: pytest.LogCaptureFixture) -> list:
    return [r for r in caplog.records if r.getMessage().startswith("delivery to telegram failed")]



async def test_a_result_telegram_did_not_take_in_an_outage_is_sent_as_soon_as_it_is_back(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db: database.Database,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Telegram went down (502 on every call) while a job ran. Its result is sent once
    the bot's polls go through again, not after the half minute (doubling to half an
    hour) its failed try earned by default; and it is sent once."""
    import logging

    fake_telegram.open_chat(558)
    await db.commands.seed()
    wf = workflow.find("f")
    values = wf.validate({"prompt": "a fox", "steps": 2, "width": 256, "height": 256})
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.WARNING, logger="comfyveil.worker"):
        async with bot_catching_up(fake_telegram, db, fake_comfy):  # the default delays
            fake_telegram.go_down()
            waiting = await db.jobs.enqueue(jobs.NewJob(
                user_id=558, chat_id=558, command="f", workflow_hash=wf.hash, params=values))
            await wait_for(lambda: _now(bool(_failures(caplog))), timeout=20)
            await asyncio.sleep(1.5)  # the outage goes on: the bot's polls fail too
            assert not _to(558, ok=None)(fake_telegram.sent)
            fake_telegram.come_back()
            back = loop.time()
            await wait_for(
                lambda: _is(db.jobs.delivery_outcome(waiting.id, "telegram"), jobs.DELIVERED),
                timeout=15,
            )
            assert loop.time() - back < 10
    assert "Telegram could not be reached" in _failures(caplog)[0].getMessage()
    sent = [c.method for c in _to(558)(fake_telegram.sent)]
    assert sent.count("sendPhoto") + sent.count("sendDocument") == 1, sent
