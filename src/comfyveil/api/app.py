"""The images API as an aiohttp application (mounted by the web process under /v1):
its services, the key of each request, errors in OpenAI's shape, and the routes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from comfyveil import config, i18n
from comfyveil import policy as policy_mod
from comfyveil.api import formats, images, job_events, jobs, links, openapi, webhooks
from comfyveil.api.context import SERVICES, ApiServices, caller, services
from comfyveil.api.errors import ApiError
from comfyveil.comfy import pool as pool_mod
from comfyveil.desk import access as access_mod
from comfyveil.desk import availability, failures
from comfyveil.desk import registry as registry_mod
from comfyveil.i18n import _
from comfyveil.images import MIMES
from comfyveil.store import api_keys, database, web_state, web_tables
from comfyveil.store import errors as store_errors

logger = logging.getLogger(__name__)

LINK_SECRET = "api_links"  # web_secrets row of the signed result links


@web.middleware
async def _guard(request: web.Request, handler: Any) -> web.StreamResponse:
    i18n.set_language(i18n.DEFAULT)  # until the key's account says otherwise
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPRequestEntityTooLarge:
        return ApiError(413, _("That upload is too large.")).response()
    except web.HTTPException as exc:
        if exc.status == 405:
            return ApiError(405, _("That is not something this page does.")).response()
        if exc.status >= 400:
            return ApiError(exc.status, _("There is nothing here."), code="not_found").response()
        raise
    except store_errors.DatabaseUnreachable:
        logger.warning(
            "API request: the database is unreachable", extra={"action": "api_database_down"}
        )
        return ApiError(
            503, _(failures.DATABASE_DOWN), type="server_error", code="database_down"
        ).response()
    except Exception as exc:
        # The type only: a message or traceback could hold the request's prompt.
        logger.error("API request failed: %s", type(exc).__name__, extra={"action": "api_error"})
        return ApiError(
            500, _("Something went wrong on the server; try again."), type="server_error"
        ).response()


async def models(request: web.Request) -> web.Response:
    """The commands this key may run and some GPU can run now, as OpenAI lists models
    (the chat's menu and the web's list leave out the same ones)."""
    svc, who = await caller(request)
    entries = availability.runnable(
        svc.pool, [e for e in await svc.registry.all() if e.allows(who)]
    )
    data = [
        {"id": e.name, "object": "model", "created": 0, "owned_by": "comfyveil"} for e in entries
    ]
    return web.json_response({"object": "list", "data": data})


async def model(request: web.Request) -> web.Response:
    svc, who = await caller(request)
    entry = await svc.registry.get(request.match_info["model"])
    if entry is None or not entry.allows(who):
        raise images.unknown_model(request.match_info["model"])
    return web.json_response(
        {"id": entry.name, "object": "model", "created": 0, "owned_by": "comfyveil"}
    )


async def file(request: web.Request) -> web.StreamResponse:
    """A result through a signed link (no key: the link is the permission)."""
    svc = services(request)
    try:
        job_id = images.job_uuid(request.match_info["job"])
        index = int(request.match_info["index"])
    except ValueError:
        raise web.HTTPNotFound() from None
    expires = request.query.get("expires", "")
    sig = request.query.get("sig", "")
    fmt = request.query.get("format", "")
    if not links.well_formed(expires, sig):
        raise web.HTTPNotFound()
    if not links.valid(svc.link_secret, job_id, index, expires, sig, fmt=fmt):
        raise ApiError(403, _("That link has expired or is not valid."), code="invalid_link")
    found = next((o for o in await svc.db.jobs.outputs(job_id) if o.index == index), None)
    if found is None or found.mime not in MIMES:
        raise web.HTTPNotFound()
    data, mime = found.data, found.mime
    if fmt in formats.FORMATS:  # the output_format the request asked for
        data = await asyncio.to_thread(formats.convert, data, mime, fmt, None)
        mime = formats.FORMATS[fmt]
    response = web.Response(body=data, content_type=mime)
    response.headers["Cache-Control"] = "private, no-store"
    return response


async def _lifetime(app: web.Application) -> AsyncIterator[None]:
    svc = app[SERVICES]
    svc.link_secret = await web_state.WebState(svc.db.pool).secret(LINK_SECRET)
    await svc.presence.start()
    svc.waiter.start()
    svc.sweeper.start()
    yield
    if svc.leaving:  # the last answers' notes, so a retry elsewhere finds their jobs
        await asyncio.wait(set(svc.leaving), timeout=5)
    await svc.sweeper.close()
    await svc.waiter.close()
    await svc.presence.close()  # last: until the notes above are written, rows are ours


def switched_off() -> web.Application:
    """What /v1 is with ``[api] enabled = false``: no route, so every request is a 404
    in OpenAI's shape (a client says "not found", not the pages' form check); no key is
    read, nothing queued."""
    return web.Application(middlewares=[_guard])


def build(
    settings: config.Settings,
    db: database.Database,
    *,
    pool: pool_mod.Pool | None = None,
    webhook_proxy: Callable[[], str | None] | None = None,
) -> web.Application:
    """The images API, to mount under /v1 (`web.server.start(..., mounts=...)`)."""
    svc = ApiServices(
        settings=settings,
        db=db,
        access=access_mod.Access(settings, db.users),
        registry=registry_mod.CommandRegistry(db.commands),
        policy=policy_mod.Policy(settings.policy),
        web=web_tables.WebStore(db.pool),
        keys=api_keys.ApiKeyStore(db.pool),
        pool=pool,
    )
    app = web.Application(middlewares=[_guard])
    app[SERVICES] = svc
    app.cleanup_ctx.append(_lifetime)
    app.router.add_get("/models", models)
    app.router.add_get("/models/{model}", model)
    app.router.add_post("/images/generations", images.generations)
    app.router.add_post("/images/edits", images.edits)
    app.router.add_get("/files/{job}/{index}", file)
    add_job_routes(app)
    sender = webhooks.Sender(
        db,
        private_ok=settings.api.webhook_private_targets,
        via_anon=settings.api.webhooks_via == "anon",
        proxy_url=webhook_proxy,
    )
    app[WEBHOOKS] = sender

    async def sending(_app: web.Application) -> AsyncIterator[None]:
        sender.start()
        yield
        await sender.close()

    app.cleanup_ctx.append(sending)
    return app


WEBHOOKS = web.AppKey("api_webhooks", webhooks.Sender)


def add_job_routes(app: web.Application) -> None:
    """The jobs API beside the images API, on the same keys, and the document of both."""
    app[job_events.CLOSING] = asyncio.Event()
    app.on_shutdown.append(job_events.close_streams)
    app.router.add_post("/jobs", jobs.create)
    app.router.add_get("/jobs", jobs.listing)
    app.router.add_get("/jobs/{job}", jobs.show)
    app.router.add_delete("/jobs/{job}", jobs.delete)
    app.router.add_get("/jobs/{job}/events", job_events.stream)
    app.router.add_get("/jobs/{job}/outputs/{index}", jobs.output)
    app.router.add_get("/openapi.json", openapi.document)
