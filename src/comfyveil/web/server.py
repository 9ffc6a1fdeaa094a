"""Serving the web front end on its address, beside (or without) the Telegram bot."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import hdrs, web, web_protocol, web_server

from comfyveil import config
from comfyveil import tasks as background
from comfyveil.comfy import pool as pool_mod
from comfyveil.desk.links import link_base as link_base
from comfyveil.desk.links import public_url
from comfyveil.store import database, web_state, web_tables
from comfyveil.store import errors as store_errors
from comfyveil.web import app as web_app

logger = logging.getLogger(__name__)

PURGE_INTERVAL = 3600.0
FORM_SECRET = "forms"  # web_secrets row of logged-out forms' CSRF tokens


@dataclass
class Running:
    url: str  # where users open it
    port: int  # the port it listens on (the configured one, or the one chosen for 0)
    runner: web.AppRunner
    purge: asyncio.Task[None]

    async def close(self) -> None:
        await background.cancel_and_wait([self.purge])
        await self.runner.cleanup()


class _ErrorResponse(web.Response):
    """An answer to a request the parser rejected: the app (and its prepare hook) never
    saw it, so the headers are set here, and aiohttp's Server header taken out."""

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        self.headers.popall(hdrs.SERVER, None)


class _Handler(web_protocol.RequestHandler):
    def handle_error(self, request, status=500, exc=None, message=None):  # type: ignore[no-untyped-def]
        plain = super().handle_error(request, status, exc, message)
        response = _ErrorResponse(
            status=plain.status,
            body=plain.body,
            headers=web_app.HEADERS,
            content_type="text/plain",
        )
        response.force_close()
        return response


class _Server(web_server.Server):
    __slots__ = ()

    def __call__(self) -> web_protocol.RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


async def _purge_forever(store: web_tables.WebStore) -> None:
    while True:
        try:
            await store.purge()
        except store_errors.StoreError as exc:
            logger.warning("could not purge old web sessions: %s", exc)
        await asyncio.sleep(PURGE_INTERVAL)


async def start(
    settings: config.Settings,
    db: database.Database,
    *,
    pool: pool_mod.Pool | None = None,
    mounts: Mapping[str, web.Application] | None = None,
) -> Running:
    """Listen on `[web] host` and `port`; stop it with `Running.close()`. `mounts` are
    served beside the pages on the same port (the images API under /v1, which the caller
    builds: the web front end knows no other front end)."""
    secret = await web_state.WebState(db.pool).secret(FORM_SECRET)
    application = web_app.build(settings, db, pool=pool, form_secret=secret, mounts=mounts)
    runner = web.AppRunner(application, access_log=None)  # no request lines: they hold ids
    await runner.setup()
    if runner.server is not None and type(runner.server) is web_server.Server:
        runner.server.__class__ = _Server  # malformed requests get our headers too
    site = web.TCPSite(runner, settings.web.host, settings.web.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise config.ConfigError(
            f"the web front end cannot listen on {settings.web.host}:{settings.web.port}: "
            f"{exc.strerror or exc}; set [web] port (or enabled = false)"
        ) from exc
    port = settings.web.port
    server = getattr(site, "_server", None)
    if server is not None and server.sockets:
        port = server.sockets[0].getsockname()[1]
    purge = asyncio.create_task(_purge_forever(web_app.services_of(application).web))
    return Running(url=public_url(settings, port), port=port, runner=runner, purge=purge)


async def first_invite(
    settings: config.Settings, db: database.Database, url: str, *, terminal: bool
) -> str | None:
    """What a start says of the first admin's invitation, or None once an account exists
    (and then no first-admin link stays open). On a terminal: a new link (replacing any
    earlier unused one). Elsewhere (a journal, a log file, which others may read): which
    command prints it, and no link is made."""
    store = web_tables.WebStore(db.pool)
    if await store.accounts(limit=1):
        await store.close_first_admin_invites()
        return None
    if not terminal:
        return (
            "no web account yet: `comfyveil web invite --admin` prints the first admin's "
            "invitation (works once)"
        )
    token = await store.create_invite(is_admin=True, hours=settings.web.invite_hours)
    return f"first admin invitation (works once): {url}/invite/{token}"
