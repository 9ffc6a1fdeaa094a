"""The aiohttp application: security headers, sessions, CSRF, templates and the routes.

Every response, error pages and images included, carries the headers of `HEADERS` and no
`Server` header. Every POST must carry the form's CSRF token: the session's own once
logged in, else an HMAC of a random cookie the login and sign-up pages set. Pages are
rendered by Jinja2 with autoescape; no page has a script or an inline style.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from comfyveil import config, constant_time, hosts, i18n
from comfyveil import tasks as background
from comfyveil.comfy import pool as pool_mod
from comfyveil.desk import access as access_mod
from comfyveil.desk import failures, links
from comfyveil.desk import language as language_mod
from comfyveil.desk import registry as registry_mod
from comfyveil.i18n import _
from comfyveil.store import database, web_tables
from comfyveil.store import errors as store_errors
from comfyveil.web import account_pages, admin, auth, job_pages, pages, webhook_pages
from comfyveil.web.page import (
    SERVICES,
    WebServices,
    error_page,
    preferences,
    services,
    visit,
)

logger = logging.getLogger(__name__)

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; img-src 'self'; style-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
STATIC_PREFIX = "/static/"
FORM_SLACK = 1024 * 1024  # a form's other fields and multipart framing beside its image


# -- middlewares ---------------------------------------------------------------------------


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(HEADERS)
    response.headers.popall("Server", None)


def _mounted(request: web.Request) -> bool:
    """True for a request to an application mounted under a prefix (the images API): it
    has its own keys, errors and no forms, so the pages' middlewares leave it alone."""
    return len(request.match_info.apps) > 1


@web.middleware
async def _session(request: web.Request, handler: Any) -> web.StreamResponse:
    if _mounted(request):
        return await handler(request)
    svc = services(request)
    token = request.cookies.get(auth.SESSION_COOKIE)
    if request.path.startswith(STATIC_PREFIX) and request.method == "GET":
        return await handler(request)  # the same for everyone: no session to look up
    if token:
        found = await svc.web.session(token)
        if found is not None:
            v = visit(request)
            v.account, v.csrf, v.user = found.account, found.csrf, found.user
            v.session_token = token
    settings = preferences(request) if visit(request).account is not None else None
    i18n.set_language(language_mod.choose(settings, request.headers.get("Accept-Language")))
    if request.method == "POST" and not await _form_read(request):
        # Refused before any handler: a handler reading the form again would see what
        # follows the undecodable field, unchecked, CSRF token and all.
        return error_page(
            request,
            400,
            _("That form could not be read. Go back, reload the page and send it again."),
        )
    if request.method == "POST" and not await _csrf_ok(request):
        return error_page(
            request,
            403,
            _(
                "This form has expired or did not come from this site. Go back, reload the "
                "page and send it again."
            ),
        )
    return await handler(request)


async def _form_read(request: web.Request) -> bool:
    """Whether the POST's form parses (a form too large is answered 413 by `_errors`).
    A cross-site form can send bytes that are not UTF-8, a part without a name or a
    broken multipart body; none of them may pass as a form without a token."""
    try:
        await request.post()
    except web.HTTPException:
        raise
    except Exception:  # any parse failure: refused the same way
        return False
    return True


async def _csrf_ok(request: web.Request) -> bool:
    form = await request.post()  # parsed once by `_form_read`, cached by aiohttp
    sent = form.get("csrf")
    if not isinstance(sent, str) or not sent:
        return False
    if visit(request).account is not None:
        return constant_time.same(sent, visit(request).csrf)
    return services(request).forms.valid(request.cookies.get(auth.ANON_COOKIE), sent)


def _names(settings: config.Settings) -> list[str]:
    """The names the web front end answers besides addresses: [web] public_url's, the
    hidden service's address (once published), [web] host's, the machine's own."""
    found = [settings.web.host, *hosts.own_names()]
    if settings.web.public_url:
        found.append(urlsplit(settings.web.public_url).hostname or "")
    if settings.web.hidden_service:
        hostname = settings.data_dir / "anon" / "hs" / links.SERVICE_NAME / "hostname"
        with contextlib.suppress(OSError):
            found.append(hostname.read_text().strip())
    return found


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    if _mounted(request):
        return await handler(request)
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_page(request, 404, _("There is nothing here."))
    except web.HTTPMethodNotAllowed:
        return error_page(request, 405, _("That is not something this page does."))
    except web.HTTPRequestEntityTooLarge:
        return error_page(request, 413, _("That upload is too large."))
    except web.HTTPException:
        raise
    except store_errors.DatabaseUnreachable:
        # PostgreSQL restarting: a moment's wait, not a bug to log with its stack
        logger.warning(
            "web request: the database is unreachable", extra={"action": "web_database_down"}
        )
        return error_page(request, 503, _(failures.DATABASE_DOWN))
    except Exception:
        logger.exception("web request failed", extra={"action": "web_error"})
        return error_page(request, 500, _("Something went wrong on the server; try again."))


async def _stylesheet(request: web.Request) -> web.Response:
    response = web.Response(
        body=services(request).stylesheet, content_type="text/css", charset="utf-8"
    )
    response.headers["Cache-Control"] = "max-age=3600"
    return response


def build(
    settings: config.Settings,
    db: database.Database,
    *,
    pool: pool_mod.Pool | None = None,
    form_secret: bytes | None = None,
    mounts: Mapping[str, web.Application] | None = None,
) -> web.Application:
    """The web front end as an aiohttp application, with `mounts` (prefix: application,
    such as the images API under /v1) served beside the pages. `form_secret`: the site's
    key of logged-out forms' tokens, shared by every web process (random without one)."""
    svc = WebServices(
        settings=settings,
        db=db,
        web=web_tables.WebStore(db.pool),
        registry=registry_mod.CommandRegistry(db.commands),
        access=access_mod.Access(settings, db.users),
        pool=pool,
        forms=auth.FormTokens(form_secret),
    )
    app = web.Application(
        middlewares=[hosts.middleware(lambda: _names(settings)), _errors, _session],
        client_max_size=settings.limits.max_image_bytes + FORM_SLACK,
    )
    app[SERVICES] = svc
    app.cleanup_ctx.append(_follow_commands)
    app.on_response_prepare.append(_headers)
    app.router.add_get("/static/style.css", _stylesheet)
    account_pages.add_routes(app)
    pages.add_routes(app)
    job_pages.add_routes(app)
    webhook_pages.add_routes(app)
    admin.add_routes(app)
    for prefix, mounted in (mounts or {}).items():
        app.add_subapp(prefix, mounted)
    return app


async def _follow_commands(app: web.Application) -> AsyncIterator[None]:
    """While the site runs, a command added, removed or switched on or off elsewhere (the
    CLI, the bot's process) shows at the next page, not up to 30 s later."""
    svc = app[SERVICES]
    task = asyncio.create_task(svc.registry.follow(svc.db), name="web-commands-follow")
    yield
    await background.cancel_and_wait([task])


def services_of(application: web.Application) -> WebServices:
    return application[SERVICES]
