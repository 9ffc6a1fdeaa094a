"""`comfyveil run`: the whole service in one process: database, worker, Telegram bot and
web front end (`[web] enabled`; alone when there is no Telegram token).

    COMFYVEIL_TELEGRAM_TOKEN=123:ABC comfyveil run --config comfyveil.toml

Starts (or connects to) PostgreSQL and applies migrations, seeds the shipped commands,
starts anon when a backend or the Bot API traffic goes through the Anyone network, then
the backend pool, one worker and the bot. SIGTERM or Ctrl-C: stop claiming jobs at once,
let running jobs finish within ``[worker] stop_grace`` (8 s; their results are still
sent), hand the rest back to the queue with their prompts left running on the GPU (the
next worker re-attaches), answer commands until then, close everything. The 8 s are the
whole stop, counted from the signal (Docker kills at 10 s): the jobs' wait is what is left
after a share kept for handing back and closing.

The token comes only from COMFYVEIL_TELEGRAM_TOKEN or ``[telegram] token_file``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comfyveil import cli, config, config_load, logs, retention
from comfyveil import tasks as background
from comfyveil.anyone import runtime
from comfyveil.cli import _operate
from comfyveil.cli import worker as worker_cli
from comfyveil.comfy import limits as comfy_limits
from comfyveil.comfy import pool
from comfyveil.store import database
from comfyveil.telegram import app
from comfyveil.worker import Worker, WorkerOptions
from comfyveil.worker import options as worker_options

if TYPE_CHECKING:
    from aiohttp import web as aiohttp_web

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help=cli.SUBCOMMANDS["run"],
        description="Start the database (embedded unless [database] url or DATABASE_URL is "
        "set), a worker for the configured backends, the Telegram bot and the web front end "
        "([web] enabled, on by default; alone when there is no bot token), until SIGTERM or "
        "Ctrl-C. The bot token comes from COMFYVEIL_TELEGRAM_TOKEN or [telegram] token_file.",
    )
    parser.add_argument(
        "--config", type=Path, default=None, metavar="FILE",
        help="settings file (default: COMFYVEIL_CONFIG, else ./comfyveil.toml)",
    )
    parser.set_defaults(handler=run)


def settle_heap() -> None:
    """Leave what start-up made (modules, compiled templates, catalogs, the schema's
    queries) out of every later full garbage collection: it lives as long as the process,
    and scanning it took 20-45 ms a time, stalling every page and update in flight
    (benchmarks/web_pages.py saw those pauses as its slowest requests)."""
    gc.collect()
    gc.freeze()


async def run(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    telegram = bool(settings.telegram.token)
    if not telegram and not settings.web.enabled:
        raise config.ConfigError(app.NO_TOKEN)
    return await serve(settings, telegram=telegram, web=settings.web.enabled)


def mounts(
    settings: config.Settings,
    db: database.Database,
    backends: pool.Pool,
    *,
    webhook_proxy: Callable[[], str | None] | None = None,
) -> dict[str, aiohttp_web.Application]:
    """What the web process serves beside its pages: the images API under /v1, or with
    ``[api] enabled = false`` a /v1 that answers 404 to everything. Composed here, as the
    web front end knows no other front end (the tests' web stack composes it with this
    too)."""
    from comfyveil.api import app as api_app

    if not settings.api.enabled:
        return {"/v1": api_app.switched_off()}
    return {"/v1": api_app.build(settings, db, pool=backends, webhook_proxy=webhook_proxy)}


async def poller_lock(db: database.Database, token: str) -> Any | None:
    """Hold, for this process's life, the lock that says "this bot is polled from here"
    (a PostgreSQL advisory lock on its own connection, named by the bot's id, never its
    secret); None when another process on this database holds it. The connection's end
    (the process's) frees it."""
    bot_id = token.partition(":")[0]
    conn = await database.connect(db.url)
    try:
        cursor = await conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%(key)s, 0)) AS got",
            {"key": f"comfyveil telegram poller {bot_id}"},
        )
        row = await cursor.fetchone()
    except BaseException:
        await conn.close()
        raise
    if row is None or not row["got"]:
        await conn.close()
        return None
    return conn


async def serve(settings: config.Settings, *, telegram: bool, web: bool) -> int:
    """The database, anon when needed, the pool, a worker, and the front ends asked for
    (the Telegram bot, the web front end or both), until SIGTERM or Ctrl-C."""
    from comfyveil.web import hidden as web_hidden
    from comfyveil.web import server as web_server

    logs.apply_settings(settings)
    published = (
        await asyncio.to_thread(web_hidden.prepare, settings)
        if web and settings.web.hidden_service else None
    )

    stop = asyncio.Event()
    signalled: list[float] = []  # time.monotonic() of the first signal

    def on_signal() -> None:
        if not signalled:
            signalled.append(time.monotonic())
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    bot: app.TelegramBot | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            router = await stack.enter_async_context(
                runtime.anon_for(
                    settings, settings.backend_list(), telegram=telegram,
                    hidden_services=[published.spec] if published else (),
                    also=['webhooks ([api] webhooks_via = "anon")']
                    if web and settings.api.enabled and settings.api.webhooks_via == "anon"
                    else (),
                )
            )
            db = await database.Database.open(settings)
            stack.push_async_callback(db.close)
            if telegram:
                # Before anything starts: a second process on this token would cut the
                # running service's long poll off, so it is this one that goes.
                held = await poller_lock(db, settings.telegram.token or "")
                if held is None:
                    raise app.AnotherPoller()
                stack.push_async_callback(held.close)
            await db.commands.seed()
            backends = await stack.enter_async_context(
                pool.Pool(settings.backend_list(), proxy_for=router.proxy_for,
                          on_down=router.backend_down, limits=comfy_limits.outputs(settings.limits),
                          routing=settings.worker.routing, memory=db.model_lists)
            )
            worker_cli.say_unreachable(backends)
            bot = (
                app.TelegramBot(settings, db, pool=backends, proxy=router.telegram_proxy())
                if telegram else None
            )
            worker = Worker(
                db, backends, sinks=[bot.sink] if bot is not None else [],
                options=WorkerOptions(
                    lease_seconds=settings.worker.lease_seconds,
                    poll_interval=settings.worker.poll_interval,
                    job_timeout=settings.worker.job_timeout,
                    shutdown_grace=settings.worker.stop_grace,
                    max_wait_offline=settings.worker.max_wait_offline,
                ),
            )
            failed: list[BaseException] = []  # the bot's late start, refused: the process ends
            if bot is not None:
                stack.push_async_callback(bot.close)
                try:
                    await bot.start()
                    _say_running(bot)
                except app.BotApiUnreachable as exc:
                    # Telegram is down as we start: the web front end and worker serve
                    # meanwhile; chat messages wait at Telegram, results for chats are
                    # tried again as in any outage.
                    print(f"comfyveil: {exc}; the bot tries again until it answers, the "
                          "web front end and worker run meanwhile", file=sys.stderr,
                          flush=True)
                    late = asyncio.create_task(
                        _start_late(bot, failed, stop), name="bot-start")
                    stack.push_async_callback(background.cancel_and_wait, [late])
            if web:
                site = await web_server.start(
                    settings, db, pool=backends,
                    mounts=mounts(settings, db, backends, webhook_proxy=lambda: (
                        router.anon.socks_url("webhooks") if router.anon is not None else None
                    )),
                )
                stack.push_async_callback(site.close)
                print(f"comfyveil: web front end at {site.url}", flush=True)
                links = site.url
                if published is not None:
                    address = await web_hidden.announce(published, router.anon, stack)
                    print(f"comfyveil: web front end as a hidden service: http://{address}",
                          flush=True)
                    links = settings.web.public_url or f"http://{address}"
                invite = await web_server.first_invite(
                    settings, db, links, terminal=sys.stdout.isatty()
                )
                if invite is not None:
                    print(f"comfyveil: {invite}", flush=True)
                if bot is None:
                    print("comfyveil: no Telegram token, so the web front end runs alone; "
                          "Ctrl-C stops it", flush=True)
            purge = asyncio.create_task(
                retention.purge_forever(db, settings.privacy, backends=backends),
                name="retention",
            )
            stack.callback(purge.cancel)
            await stack.enter_async_context(
                _operate.operated(settings, db=db, pool=backends, worker=worker)
            )
            settle_heap()
            worker_task = asyncio.create_task(worker.run(), name="worker")
            stopping = asyncio.create_task(stop.wait(), name="stop-signal")
            watched = {worker_task, stopping}
            if bot is not None:
                conflict = asyncio.create_task(bot.conflict.wait(), name="bot-conflict")
                stack.callback(conflict.cancel)
                watched.add(conflict)
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if bot is not None and bot.conflict.is_set() and not stopping.done():
                # Another process (on another database: one on this database was stopped
                # at its start by the poller lock) took the bot's updates. Two would take
                # turns stealing them: this one stops polling at once, and only that; its
                # web front end and worker go on (results still reach the chat), until a
                # signal stops them as ever.
                await bot.stop_updates()
                print(f"comfyveil: {POLL_LOST}", file=sys.stderr, flush=True)
                await asyncio.wait({worker_task, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            # Stop claiming at once; jobs still running get [worker] stop_grace to finish,
            # then go back to the queue with their prompt left running on its GPU (the next
            # worker re-attaches). Commands are answered until the end meanwhile (a new job
            # waits in the queue for that worker).
            since = signalled[0] if signalled else time.monotonic()
            worker.stop(deadline=worker_options.stop_deadline(settings.worker.stop_grace, since))
            await worker_task  # results finished meanwhile still go out
            if bot is not None:
                await bot.stop_updates()
            if failed:
                raise failed[0]
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
    print("comfyveil: stopped", flush=True)
    return 0


async def _start_late(
    bot: app.TelegramBot, failed: list[BaseException], stop: asyncio.Event
) -> None:
    """The bot's start, once the Bot API answers; a start refused for another reason (the
    token) stops the process, as it would have at its start."""
    try:
        await bot.start_when_reachable()
    except Exception as exc:
        failed.append(exc)
        stop.set()
        return
    _say_running(bot)


def _say_running(bot: app.TelegramBot) -> None:
    print(f"comfyveil: @{bot.services.bot_username} is running; Ctrl-C stops it", flush=True)


POLL_LOST = ("another process is polling this bot (the same token); this one stops reading "
             "the bot's messages, its web front end and worker go on")
