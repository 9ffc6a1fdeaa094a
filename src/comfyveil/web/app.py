"""The aiohttp application: security headers, sessions, CSRF, templates and the routes.

Every response, error pages and images included, carries the headers of `HEADERS` and no
`Server` header. Every POST must carry the form's CSRF token: the session's own once
logged in, else an HMAC of a random cookie the login and sign-up pages set. Pages are
rendered by Jinja2 with autoescape; no page has a script or an inline style.
"""

from __future__ import annotations

import datetime
import hmac
import logging
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import jinja2
import markupsafe
from aiohttp import web

from comfyveil import config, i18n
from comfyveil.comfy import pool as pool_mod
from comfyveil.desk import access as access_mod
from comfyveil.desk import language as language_mod
from comfyveil.desk import registry as registry_mod
from comfyveil.desk.words import status_word
from comfyveil.i18n import _
from comfyveil.store import accounts as web_store
from comfyveil.store import database
from comfyveil.web import auth

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


@dataclass
class WebServices:
    """What the handlers share: the store, the commands, limits, templates."""

    settings: config.Settings
    db: database.Database
    web: web_store.WebStore
    registry: registry_mod.CommandRegistry
    access: access_mod.Access
    pool: pool_mod.Pool | None = None
    forms: auth.FormTokens = field(default_factory=auth.FormTokens)
    site: auth.SiteThrottle = field(default_factory=auth.SiteThrottle)
    templates: jinja2.Environment = field(init=False)
    stylesheet: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("comfyveil.web", "templates"),
            autoescape=True,
            auto_reload=False,  # templates ship with the package: no stat() per page
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.i18n"],
        )
        # The callables read the request's language (a context variable) when called.
        self.templates.install_gettext_callables(  # type: ignore[attr-defined]
            i18n.gettext, i18n.ngettext, newstyle=True
        )
        self.templates.globals["status_word"] = status_word
        # Inside a right-to-left page: commands and ids keep their order (``ltr``, Unicode
        # isolates, fit for attributes and titles too); a name or prompt takes its own
        # direction (``bdi``).
        self.templates.globals["ltr"] = i18n.ltr
        self.templates.globals["bdi"] = bdi
        self.templates.globals["when"] = when
        self.stylesheet = (resources.files("comfyveil.web") / "static" / "style.css").read_bytes()

    @property
    def secure_cookies(self) -> bool:
        return (self.settings.web.public_url or "").startswith("https://")

    def parallel(self) -> int:
        """How many jobs run at once, to share out the queue ahead in an ETA."""
        return max(1, len(self.settings.backend_list()))


SERVICES = web.AppKey("services", WebServices)


@dataclass
class Visit:
    """What one request learnt about its visitor."""

    account: web_store.Account | None = None
    csrf: str = ""  # the session's CSRF token
    session_token: str | None = None
    set_anon_cookie: str | None = None  # a new form cookie to set on the response


VISIT = web.RequestKey("visit", Visit)


def visit(request: web.Request) -> Visit:
    found = request.get(VISIT)
    if found is None:
        found = request[VISIT] = Visit()
    return found


def services(request: web.Request) -> WebServices:
    return request.app[SERVICES]


# -- rendering ---------------------------------------------------------------------------

def bdi(text: object) -> markupsafe.Markup:
    """`text` (escaped) in its own direction, whatever the page's."""
    return markupsafe.Markup("<bdi>%s</bdi>") % str(text)


def when(moment: datetime.datetime, *, date_only: bool = False) -> markupsafe.Markup:
    """A UTC time as ``<time>``: left to right and on one line in any page (a date broken
    at its hyphens reads backwards in a right-to-left table)."""
    text = moment.strftime("%Y-%m-%d" if date_only else "%Y-%m-%d %H:%M")
    return markupsafe.Markup('<time datetime="%s" dir="ltr" class="when">%s</time>') % (
        moment.isoformat(timespec="seconds"), text)


def render(
    request: web.Request, template: str, *, status: int = 200, **context: Any
) -> web.Response:
    svc = services(request)
    account = visit(request).account
    csrf = visit(request).csrf
    page = svc.templates.get_template(template).render(
        account=account,
        csrf=csrf,
        path=request.path,
        lang=i18n.current(),
        dir="rtl" if i18n.current() in i18n.RTL else "ltr",
        refresh=context.pop("refresh", None),
        **context,
    )
    response = web.Response(text=page, status=status, content_type="text/html", charset="utf-8")
    response.headers["Cache-Control"] = "no-store"
    anon = visit(request).set_anon_cookie
    if anon:
        response.set_cookie(
            auth.ANON_COOKIE,
            anon,
            httponly=True,
            samesite="Strict",
            path="/",
            secure=svc.secure_cookies,
        )
    return response


def error_page(request: web.Request, status: int, message: str) -> web.Response:
    return render(request, "error.html", status=status, message=message)


def anon_csrf(request: web.Request) -> str:
    """The CSRF token of a logged-out form; sets the cookie it is bound to if missing."""
    v = visit(request)
    if v.account is not None:  # a logged-in visitor's forms carry the session's token
        return v.csrf
    svc = services(request)
    cookie = request.cookies.get(auth.ANON_COOKIE) or v.set_anon_cookie
    if not cookie:
        cookie = v.set_anon_cookie = web_store.new_token()
    return svc.forms.token_for(cookie)


def require_account(request: web.Request) -> web_store.Account:
    account = visit(request).account
    if account is None:
        raise web.HTTPSeeOther("/login")
    return account


def require_admin(request: web.Request) -> web_store.Account:
    account = require_account(request)
    if not account.is_admin:
        raise web.HTTPNotFound()
    return account


# -- middlewares ---------------------------------------------------------------------------


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(HEADERS)
    response.headers.popall("Server", None)


@web.middleware
async def _session(request: web.Request, handler: Any) -> web.StreamResponse:
    svc = services(request)
    token = request.cookies.get(auth.SESSION_COOKIE)
    if request.path.startswith(STATIC_PREFIX) and request.method == "GET":
        return await handler(request)  # the same for everyone: no session to look up
    if token:
        found = await svc.web.session(token)
        if found is not None:
            v = visit(request)
            v.account, v.csrf = found
            v.session_token = token
    settings = None
    if visit(request).account is not None:
        settings = await svc.db.users.settings(visit(request).account.user_id)  # type: ignore[union-attr]
    i18n.set_language(language_mod.choose(settings, request.headers.get("Accept-Language")))
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


async def _csrf_ok(request: web.Request) -> bool:
    try:
        form = await request.post()
    except ValueError:  # too large or malformed: the handler answers in words
        return True
    sent = form.get("csrf")
    if not isinstance(sent, str) or not sent:
        return False
    if visit(request).account is not None:
        return hmac.compare_digest(sent, visit(request).csrf)
    return services(request).forms.valid(request.cookies.get(auth.ANON_COOKIE), sent)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
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
) -> web.Application:
    """The web front end as an aiohttp application."""
    from comfyveil.web import account_pages, admin, job_pages, pages

    svc = WebServices(
        settings=settings,
        db=db,
        web=web_store.WebStore(db.pool),
        registry=registry_mod.CommandRegistry(db.commands),
        access=access_mod.Access(settings, db.users),
        pool=pool,
    )
    app = web.Application(
        middlewares=[_errors, _session],
        client_max_size=settings.limits.max_image_bytes + FORM_SLACK,
    )
    app[SERVICES] = svc
    app.on_response_prepare.append(_headers)
    app.router.add_get("/static/style.css", _stylesheet)
    account_pages.add_routes(app)
    pages.add_routes(app)
    job_pages.add_routes(app)
    admin.add_routes(app)
    return app


def services_of(application: web.Application) -> WebServices:
    return application[SERVICES]
