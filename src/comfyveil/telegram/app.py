"""Assembling the Telegram bot: the PTB Application, its handlers, status and delivery.

    bot = TelegramBot(settings, db, pool=backends)
    worker = Worker(db, backends, sinks=[bot.sink])
    await bot.start()          # getMe, command menu, status updates, long polling
    ...
    await bot.stop_updates()   # no new commands
    ...                        # let the worker finish (its sink still sends results)
    await bot.close()

The bot and the worker share one event loop, so we drive PTB's life cycle ourselves
(initialize, start, ``updater.start_polling``) instead of ``run_polling``, which owns
the loop. ``[telegram] api_url`` points PTB at a self-hosted Bot API server (or the
tests' fake) through ``base_url``/``base_file_url``; ``[anyone] telegram`` sends Bot API
traffic through anon's SOCKS port.
"""

from __future__ import annotations

import asyncio
import collections
import os

# PTB 22 warns whenever it builds a RetryAfter unless time periods are timedeltas; opt in
# before telegram.ext is imported anywhere (our tests turn warnings into errors).
os.environ.setdefault("PTB_TIMEDELTA", "true")

import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Any

from telegram import Update
from telegram.error import Conflict, InvalidToken, TelegramError
from telegram.ext import (
    Application,
    BaseRateLimiter,
    CallbackQueryHandler,
    ContextTypes,
    ExtBot,
    MessageHandler,
    SimpleUpdateProcessor,
    filters,
)

from comfyveil import config, i18n, redaction
from comfyveil import policy as policy_mod
from comfyveil import tasks as background
from comfyveil.comfy import pool as pool_mod
from comfyveil.desk import access, language, registry, words
from comfyveil.errors import ComfyveilError
from comfyveil.i18n import N_, _, ltr
from comfyveil.store import database, eta
from comfyveil.store import errors as store_errors
from comfyveil.telegram import (
    callbacks,
    commands,
    handlers,
    limits,
    replies,
    sink,
    status,
    updates,
)
from comfyveil.telegram.context import BotContext, Services, attach
from comfyveil.telegram.request import AiohttpRequest

logger = logging.getLogger(__name__)

CONCURRENT_UPDATES = 64  # updates handled at once; one slow download never blocks the rest
RATE_LIMIT_RETRIES = 3  # RetryAfter answers PTB's rate limiter waits out before giving up
CONNECTION_POOL = 64  # HTTP connections to the Bot API
MENU_REFRESH = 15.0  # seconds between checks that the command menu shows what can run
MENU_MIN_GAP = 0.5  # seconds, at least, between two such checks
OFFLINE_NOTICE_AFTER = 10.0  # seconds every GPU must be offline before admins are told
RECONNECT_FIRST = 2.0  # seconds before trying again a Bot API that failed at start
RECONNECT_MAX = 60.0  # seconds, the longest wait between two such tries
POLL_ERROR_CHARS = 200  # of the Bot API's (or a proxy's) answer quoted in a failed poll's line
ADMIN_OFFLINE = N_(
    "All GPUs are offline ({names}). Jobs wait for one to come back, each up to {span}; "
    "{backends} shows why."
)
NO_TOKEN = (
    "no Telegram bot token: set COMFYVEIL_TELEGRAM_TOKEN or [telegram] token_file "
    "(a file only you can read); it is never taken from the command line"
)


class BotApiUnreachable(ComfyveilError):
    """The Telegram Bot API could not be reached, or refused the bot, at start."""


class AnotherPoller(ComfyveilError):
    """another process is polling this bot (the same token); this one stops"""


class QuietBot(ExtBot[Any]):
    """PTB's bot, whose repr (and the Application's, which quotes it) names the bot, not
    its token as PTB's does."""

    def __repr__(self) -> str:
        user = self._bot_user
        return f"QuietBot[username={user.username if user else None}]"

    async def close_requests(self) -> None:
        """Close the HTTP sessions of a bot whose initialize() failed (the Application's
        shutdown() then does nothing): the bot's own shutdown, which also lets a later
        initialize() open them again (closing the requests alone left the bot taking
        them for open, and every later try failed)."""
        with contextlib.suppress(Exception):
            await self.shutdown()


async def _connect(app: Application[Any, Any, Any, Any, Any, Any]) -> None:
    """initialize() (getMe), with a plain sentence instead of a traceback on failure."""
    try:
        await app.initialize()
    except InvalidToken:
        failure: ComfyveilError = config.ConfigError(
            "the Telegram Bot API refused the bot token: check COMFYVEIL_TELEGRAM_TOKEN "
            "or [telegram] token_file")
    except TelegramError as exc:
        failure = BotApiUnreachable(f"the Telegram Bot API cannot be reached ({exc})")
    else:
        return
    if isinstance(app.bot, QuietBot):
        await app.bot.close_requests()
    raise failure


class _InOrder(SimpleUpdateProcessor):
    """PTB's concurrent handling, but one update at a time per chat: "/cancel" sent right
    after "/f" is handled after it (side by side, it looked for the newest job before the
    new one was queued and cancelled an older one), while other chats go on. A chat's
    update waits for its turn before it takes one of the concurrent places. Tells
    `handling` (when given) when each update's handler ended."""

    __slots__ = ("_handling", "_holding", "_locks")

    def __init__(self, max_concurrent_updates: int, handling: updates.Handling | None) -> None:
        super().__init__(max_concurrent_updates)
        self._handling = handling
        self._locks: dict[int, asyncio.Lock] = {}  # per chat
        self._holding: collections.Counter[int] = collections.Counter()  # updates holding or
        # waiting for each chat's lock: the lock goes when none does

    async def process_update(self, update: object, coroutine: Awaitable[Any]) -> None:
        chat = update.effective_chat if isinstance(update, Update) else None
        try:
            if chat is None:
                await super().process_update(update, coroutine)
                return
            lock = self._locks.setdefault(chat.id, asyncio.Lock())
            self._holding[chat.id] += 1
            try:
                async with lock:  # FIFO: the chat's updates in the order they came
                    await super().process_update(update, coroutine)
            finally:
                self._holding[chat.id] -= 1
                if not self._holding[chat.id]:
                    del self._holding[chat.id], self._locks[chat.id]
        finally:
            if self._handling is not None and isinstance(update, Update):
                self._handling.done(update.update_id)


def build_application(
    settings: config.Settings,
    *,
    proxy: str | None = None,
    rate_limiter: BaseRateLimiter[Any] | None = None,
    updates_request: AiohttpRequest | None = None,
    handling: updates.Handling | None = None,
) -> Application[Any, Any, Any, Any, Any, Any]:
    """The PTB Application with comfyveil's handlers, in reading order
    (`updates_request`: the caller's own for getUpdates, to stop polling without PTB;
    `handling`: the updates being handled, which that request leaves unconfirmed).

    Raises:
        ConfigError: no bot token.
    """
    tg = settings.telegram
    if not tg.token:
        raise config.ConfigError(NO_TOKEN)
    # Before PTB sees the token: it logs the API URL, which holds it, at debug level.
    redaction.register(tg.token)
    redaction.install()
    urls = {}
    if tg.api_url:
        base = tg.api_url.rstrip("/")
        urls = {"base_url": f"{base}/bot", "base_file_url": f"{base}/file/bot"}
    bot = QuietBot(
        tg.token,
        request=AiohttpRequest(connection_pool_size=CONNECTION_POOL, pool_timeout=10.0,
                               media_write_timeout=60.0, proxy=proxy),
        get_updates_request=updates_request or AiohttpRequest(connection_pool_size=1,
                                                              proxy=proxy),
        rate_limiter=rate_limiter or limits.ChatRateLimiter(max_retries=RATE_LIMIT_RETRIES),
        **urls,
    )
    application = (
        Application.builder()
        .bot(bot)
        .context_types(ContextTypes(context=BotContext))
        .concurrent_updates(_InOrder(CONCURRENT_UPDATES, handling))
        .build()
    )
    messages = filters.UpdateType.MESSAGE & (
        filters.TEXT | filters.CAPTION | filters.PHOTO | filters.Document.ALL
    )
    application.add_handler(MessageHandler(messages, handlers.on_message))
    application.add_handler(CallbackQueryHandler(callbacks.on_callback))
    application.add_error_handler(handlers.on_error)  # type: ignore[arg-type]
    return application


class TelegramBot:
    """The chat front end: the Application plus status tracking and result delivery.

    Args:
        settings: the loaded settings (token, api_url, limits, access).
        db: the opened store.
        pool: the backend pool when a worker runs in this process (/backends, ETAs).
        proxy: a SOCKS URL for Bot API traffic (``[anyone] telegram``).
        rate_limiter: PTB's rate limiter; default limits.ChatRateLimiter (results first).
        status_interval: seconds between two edits of a status message (private chats).
    """

    def __init__(
        self,
        settings: config.Settings,
        db: database.Database,
        *,
        pool: pool_mod.Pool | None = None,
        proxy: str | None = None,
        rate_limiter: BaseRateLimiter[Any] | None = None,
        status_interval: float = status.PRIVATE_INTERVAL,
    ) -> None:
        self.settings = settings
        handling = updates.Handling()
        # A poll answered after failed ones (an outage is over): the results Telegram did
        # not take meanwhile are sent at once (the sink's `back`), not after the delay
        # their failed tries earned.
        self._updates_request = AiohttpRequest(connection_pool_size=1, proxy=proxy,
                                               handling=handling,
                                               answered=lambda: self.sink.reachable())
        self.application = build_application(settings, proxy=proxy, rate_limiter=rate_limiter,
                                             updates_request=self._updates_request,
                                             handling=handling)
        limiter = self.application.bot.rate_limiter
        room = limiter.has_room if isinstance(limiter, limits.ChatRateLimiter) else None
        self.tracker = status.StatusTracker(
            self.application.bot, db, parallel=self._parallel, offline=self._all_offline,
            backends=lambda: eta.backends_up(self.services.pool, settings.backend_list()),
            slots=eta.slots_of(settings.backend_list()),
            is_admin=lambda user: user in settings.telegram.admins,
            room=room or (lambda: True),
            private_interval=status_interval, group_interval=status_interval * 3,
        )
        self.services = Services(
            settings=settings, db=db, access=access.Access(settings, db.users),
            commands=registry.CommandRegistry(db.commands), tracker=self.tracker, pool=pool,
            policy=policy_mod.Policy(settings.policy),
        )
        attach(self.application, self.services)
        self._connected = asyncio.Event()  # set while started: results wait for it
        self.sink = sink.TelegramSink(
            self.application.bot, self.services, connected=self._connected
        )
        self._started = False
        self._polling = False
        self.menu_refresh = MENU_REFRESH
        self._menu: tuple[str, ...] = ()
        self._menu_task: asyncio.Task[None] | None = None
        self._commands_task: asyncio.Task[None] | None = None  # follows the commands table
        self.offline_notice_after = OFFLINE_NOTICE_AFTER
        self._offline_since: float | None = None
        self._offline_told = False
        # Set when Telegram cut our long poll off for another process's: the caller stops.
        self.conflict = asyncio.Event()

    async def _menu_loop(self) -> None:
        """Keep the command menu to what some GPU can run: publish it again whenever that
        changes (a backend read anew, a model installed or removed, a command toggled)."""
        pool = self.services.pool
        while True:
            if pool is not None:  # a backend's state changed (probes report every few s)
                await pool.wait_for_change(min(self.menu_refresh, self.offline_notice_after))
            else:
                await asyncio.sleep(self.menu_refresh)
            await asyncio.sleep(MENU_MIN_GAP)  # a burst of slot releases checks once
            await self._tell_admins_if_offline()
            try:
                runnable = tuple(e.name for e in await commands.runnable_entries(self.services))
                if runnable != self._menu:
                    self._menu = await commands.publish_menu(self.services, self.application.bot)
            except Exception as exc:  # the menu is a courtesy; the next round tries again
                logger.info("command menu not refreshed: %s", type(exc).__name__,
                            extra={"action": "menu_refresh_failed"})

    def _all_offline(self) -> bool:
        pool = self.services.pool
        return pool is not None and bool(pool.backends) and not pool.any_healthy

    def _parallel(self) -> int:
        pool = self.services.pool
        if pool is None:
            return 1
        return max(1, sum(1 for b in pool.backends.values() if b.healthy))

    async def start(self) -> None:
        """Connect (getMe), publish the command menu, start status updates and polling."""
        app = self.application
        await _connect(app)
        try:
            self.services.bot_username = app.bot.username or ""
            await self.services.commands.refresh()
            try:
                self._menu = await commands.publish_menu(self.services, app.bot)
            except TelegramError as exc:  # a courtesy: the menu loop publishes it next round
                logger.info("command menu not published: %s", type(exc).__name__,
                            extra={"action": "menu_refresh_failed"})
            self._menu_task = asyncio.create_task(self._menu_loop(), name="menu-refresh")
            self._commands_task = asyncio.create_task(
                self.services.commands.follow(self.services.db), name="commands-follow")
            await self.tracker.start()
            await app.start()
            assert app.updater is not None
            await app.updater.start_polling(
                poll_interval=0.0, timeout=int(self.settings.telegram.poll_timeout),
                allowed_updates=[Update.MESSAGE, Update.CALLBACK_QUERY],
                error_callback=self._polling_failed,
            )
            self._polling = True
            self._started = True
            self._connected.set()
            self.sink.reachable()
        except BaseException as exc:
            await self._stop_menu()
            await self.tracker.stop()
            with contextlib.suppress(Exception):
                if app.running:
                    await app.stop()
            await app.shutdown()
            if isinstance(exc, TelegramError) and not isinstance(exc, InvalidToken):
                # getMe answered, then polling's first call did not (an outage beginning)
                raise BotApiUnreachable(
                    f"the Telegram Bot API cannot be reached ({exc})") from None
            raise
        logger.info("Telegram bot @%s is running", self.services.bot_username,
                    extra={"action": "bot_started"})

    async def start_when_reachable(self, first_delay: float = RECONNECT_FIRST) -> None:
        """`start`, tried again while the Bot API cannot be reached (down, answering 5xx
        or 429, or nothing), each wait twice the last up to RECONNECT_MAX: Telegram down
        as the service starts must not take its web front end and worker down too. The
        messages sent meanwhile wait at Telegram. Anything else (a refused token) is
        raised."""
        delay = first_delay
        while True:
            await asyncio.sleep(delay)
            try:
                await self.start()
                return
            except BotApiUnreachable as exc:
                logger.debug("the bot's start failed", exc_info=exc)  # redacted, as all logs
                delay = min(delay * 2, RECONNECT_MAX)
                logger.info("the Telegram Bot API still cannot be reached; trying again in "
                            "%.0f s", delay, extra={"action": "bot_unreachable"})

    def _polling_failed(self, exc: TelegramError) -> None:
        """One line per failed poll instead of PTB's traceback (it retries by itself);
        a Conflict means another process polls with our token, and one of us must go."""
        if isinstance(exc, Conflict):
            if not self.conflict.is_set():
                logger.info("another process polls this bot", extra={"action": "bot_conflict"})
                self._updates_request.refuse_polling()
                self.conflict.set()
            return
        # PTB's message quotes whatever answered (a proxy's whole error page in an outage).
        said = str(exc).split(". Parsing the server response", 1)[0][:POLL_ERROR_CHARS]
        logger.warning("polling for updates failed (%s): %s", type(exc).__name__, said,
                       extra={"action": "poll_failed"})

    async def stop_updates(self) -> None:
        """Stop taking new messages; updates being handled finish. Idempotent."""
        app = self.application
        if self._polling and app.updater is not None and app.updater.running:
            await app.updater.stop()
        self._polling = False

    async def close(self) -> None:
        """Stop everything; results the worker still delivers need the bot until here."""
        if not self._started:
            return
        self._started = False
        self._connected.clear()
        await self.stop_updates()
        app = self.application
        if app.running:
            await app.stop()
        await self._stop_menu()
        await self.tracker.stop()
        await background.cancel_and_wait(list(self.services.background))  # what is left
        await app.shutdown()
        logger.info("Telegram bot stopped", extra={"action": "bot_stopped"})

    async def _tell_admins_if_offline(self) -> None:
        """Tell the configured admins, once per outage, that every GPU is offline (after
        `offline_notice_after` seconds, so a probe's hiccup alarms no one)."""
        if not self._all_offline():
            self._offline_since, self._offline_told = None, False
            return
        now = time.monotonic()
        if self._offline_since is None:
            self._offline_since = now
        if self._offline_told or now - self._offline_since < self.offline_notice_after:
            return
        self._offline_told = True
        pool = self.services.pool
        assert pool is not None
        for admin in self.settings.telegram.admins:
            try:
                spoken = language.of_settings(await self.services.db.users.settings(admin))
            except store_errors.StoreError:
                spoken = i18n.DEFAULT
            with i18n.using(spoken):
                text = _(ADMIN_OFFLINE).format(
                    names=", ".join(ltr(n) for n in pool.backends),
                    span=ltr(words.offline_wait(self.settings.worker.max_wait_offline)),
                    backends=ltr("/backends"),
                )
            try:
                await self.application.bot.send_message(admin, replies.esc(text),
                                                        parse_mode="HTML")
            except TelegramError as exc:  # the admin never started a chat with the bot
                # The operator hears it instead: a bot may only write to who wrote first.
                logger.warning("every GPU is offline, and admin %s could not be told (%s): "
                               "they must send /start to the bot once", admin,
                               type(exc).__name__, extra={"action": "admin_notice_failed"})

    async def _stop_menu(self) -> None:
        running = [task for task in (self._menu_task, self._commands_task) if task is not None]
        self._menu_task = self._commands_task = None
        await background.cancel_and_wait(running)

    async def __aenter__(self) -> TelegramBot:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
