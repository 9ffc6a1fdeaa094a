"""The whole bot for end-to-end tests: fake Telegram -> bot -> PostgreSQL -> worker ->
fake ComfyUI -> result back to the fake Telegram, all in this test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from PIL import Image

from comfyveil import config, policy
from comfyveil.comfy import pool
from comfyveil.store import database
from comfyveil.telegram import app
from comfyveil.worker import Worker, WorkerOptions
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import BotCall, FakeTelegram

WORKER = WorkerOptions(
    lease_seconds=5.0, poll_interval=0.5, shutdown_grace=5.0, retry_backoff=0.05,
    recover_interval=0.5, delivery_grace=1.0, job_timeout=60.0,
)
SMALL = "--width 256 --height 256"  # keeps the fake's images (and the test) small


def settings_for(
    telegram: FakeTelegram, comfy: Sequence[FakeComfyUI], **telegram_options: Any
) -> config.Settings:
    limits = telegram_options.pop("limits", config.LimitsConfig())
    content_policy = telegram_options.pop("policy", policy.PolicyConfig())
    tg = config.TelegramConfig(
        token=telegram.token, api_url=telegram.url, poll_timeout=1.0,
        # Most tests follow the status message from the start; the delay has its own.
        **({"open": True, "status_delay": 0.0} | telegram_options),
    )
    backends = tuple(
        config.BackendConfig(name=f"gpu{i}", url=fake.url, via="direct")
        for i, fake in enumerate(comfy)
    )
    return config.Settings(telegram=tg, backends=backends, limits=limits, policy=content_policy)


@dataclasses.dataclass
class Stack:
    telegram: FakeTelegram
    db: database.Database
    bot: app.TelegramBot
    worker: Worker
    pool: pool.Pool

    def send(self, user: int, text: str | None = None, **kwargs: Any) -> dict[str, Any]:
        return self.telegram.user_sends(user, text, **kwargs)

    async def result(self, chat: int, count: int = 1, timeout: float = 15.0,
                     method: str = "sendPhoto") -> BotCall:
        return await self.telegram.wait_for_call(method, chat_id=chat, count=count,
                                                 timeout=timeout)

    async def reply_text(self, chat: int, count: int = 1, timeout: float = 15.0) -> str:
        call = await self.telegram.wait_for_call("sendMessage", chat_id=chat, count=count,
                                                 timeout=timeout)
        return str(call.result["text"])

    async def queued_count(self) -> int:
        async with self.db.pool.connection() as conn:
            cursor = await conn.execute("SELECT count(*) AS n FROM jobs")
            row = await cursor.fetchone()
        assert row is not None
        return int(row["n"])


@contextlib.asynccontextmanager
async def running_bot(
    telegram: FakeTelegram, db: database.Database, comfy: Sequence[FakeComfyUI],
    *, worker: bool = True, **telegram_options: Any,
) -> AsyncIterator[Stack]:
    """Bot and worker running against the fakes until the block ends."""
    settings = settings_for(telegram, comfy, **telegram_options)
    await db.commands.seed()
    async with pool.Pool(settings.backend_list(), probe_interval=0.2) as backends:
        bot = app.TelegramBot(settings, db, pool=backends, status_interval=0.2)
        runner = Worker(db, backends, sinks=[bot.sink], options=WORKER)
        await bot.start()
        task = asyncio.create_task(runner.run(), name="e2e-worker") if worker else None
        try:
            yield Stack(telegram, db, bot, runner, backends)
        finally:
            await bot.stop_updates()
            runner.stop()
            if task is not None:
                await asyncio.wait_for(task, 30)
            await bot.close()


async def no_call(
    telegram: FakeTelegram, matches: Callable[[BotCall], bool], *, within: float
) -> None:
    """Wait up to `within` seconds for a bot call from now on that `matches`, and fail if
    one comes: "nothing more is sent", waiting on the very event that would disprove it."""
    start = len(telegram.sent)
    try:
        found = await telegram.wait_for(
            lambda calls: [c for c in calls[start:] if matches(c)], timeout=within
        )
    except AssertionError:
        return  # the bound passed with no such call
    raise AssertionError(f"unexpected {found[0].method}: {found[0].params}")


def to_chat(chat: int, *methods: str) -> Callable[[BotCall], bool]:
    """Matches the bot's calls aimed at `chat` (of these methods; any if none given)."""

    def matches(call: BotCall) -> bool:
        return str(call.params.get("chat_id")) == str(chat) and (
            not methods or call.method in methods
        )

    return matches


def png(width: int = 64, height: int = 48, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()
