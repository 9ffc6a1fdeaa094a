"""`comfyveil run`: the whole service in one process: database, worker and Telegram bot.

    COMFYVEIL_TELEGRAM_TOKEN=123:ABC comfyveil run --config comfyveil.toml

Starts (or connects to) PostgreSQL and applies migrations, seeds the shipped commands,
starts anon when a backend or the Bot API traffic goes through the Anyone network, then
the backend pool, one worker and the bot. SIGTERM or Ctrl-C: stop taking messages, let
running jobs finish within the grace period (their results are still sent), hand the
rest back to the queue, close everything.

The token comes only from COMFYVEIL_TELEGRAM_TOKEN or ``[telegram] token_file``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Any

from comfyveil import cli, config, retention
from comfyveil.anyone import runtime
from comfyveil.comfy import pool
from comfyveil.store import database
from comfyveil.telegram import app
from comfyveil.worker import Worker, WorkerOptions

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help=cli.SUBCOMMANDS["run"],
        description="Start the database (embedded unless [database] url or DATABASE_URL is "
        "set), a worker for the configured backends and the Telegram bot, until SIGTERM or "
        "Ctrl-C. The bot token comes from COMFYVEIL_TELEGRAM_TOKEN or [telegram] token_file.",
    )
    parser.add_argument(
        "--config", type=Path, default=None, metavar="FILE",
        help="settings file (default: COMFYVEIL_CONFIG, else ./comfyveil.toml)",
    )
    parser.set_defaults(handler=run)


async def run(args: argparse.Namespace) -> int:
    settings = config.load(args.config)
    if not settings.telegram.token:
        raise config.ConfigError(app.NO_TOKEN)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with contextlib.AsyncExitStack() as stack:
            router = await stack.enter_async_context(
                runtime.anon_for(settings, settings.backend_list(), telegram=True)
            )
            db = await database.Database.open(settings)
            stack.push_async_callback(db.close)
            await db.commands.seed()
            backends = await stack.enter_async_context(
                pool.Pool(settings.backend_list(), proxy_for=router.proxy_for,
                          on_down=router.backend_down, limits=settings.limits.outputs,
                          routing=settings.worker.routing)
            )
            bot = app.TelegramBot(settings, db, pool=backends, proxy=router.telegram_proxy())
            worker = Worker(db, backends, sinks=[bot.sink], options=WorkerOptions(
                lease_seconds=settings.worker.lease_seconds,
                poll_interval=settings.worker.poll_interval,
                job_timeout=settings.worker.job_timeout,
            ))
            await bot.start()
            stack.push_async_callback(bot.close)
            print(f"comfyveil: @{bot.services.bot_username} is running; Ctrl-C stops it",
                  flush=True)
            purge = asyncio.create_task(
                retention.purge_forever(db, settings.privacy), name="retention"
            )
            stack.callback(purge.cancel)
            worker_task = asyncio.create_task(worker.run(), name="worker")
            stopping = asyncio.create_task(stop.wait(), name="stop-signal")
            await asyncio.wait({worker_task, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            await bot.stop_updates()
            worker.stop()
            await worker_task  # running jobs finish (or are handed back); results still go out
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
    print("comfyveil: stopped", flush=True)
    return 0
