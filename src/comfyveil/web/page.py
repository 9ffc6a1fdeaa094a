"""What every page handler shares: the services, the visitor, and rendering a page (its
template, the CSRF token of a logged-out form, the account a page requires).

`app.py` builds the application from these; page modules import this, never `app`.
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import jinja2
import markupsafe
from aiohttp import web

from comfyveil import config, i18n
from comfyveil import policy as policy_mod
from comfyveil.comfy import pool as pool_mod
from comfyveil.desk import access as access_mod
from comfyveil.desk import registry as registry_mod
from comfyveil.desk import state as job_state
from comfyveil.desk.words import status_word
from comfyveil.i18n import N_
from comfyveil.store import accounts as web_store
from comfyveil.store import database, eta, users, web_state, web_tables
from comfyveil.web import auth


@dataclass
class WebServices:
    """What the handlers share: the store, the commands, limits, templates."""

    settings: config.Settings
    db: database.Database
    web: web_tables.WebStore
    registry: registry_mod.CommandRegistry
    access: access_mod.Access
    pool: pool_mod.Pool | None = None
    forms: auth.FormTokens = field(default_factory=auth.FormTokens)
    site: auth.SiteThrottle = field(init=False)
    passphrases: auth.Passphrases = field(init=False)
    places: eta.PlaceMemory = field(default_factory=eta.PlaceMemory)  # shown, per job
    etas: eta.EtaMemory = field(default_factory=eta.EtaMemory)  # shown, per job
    states: job_state.StateMemory = field(default_factory=job_state.StateMemory)  # shown
    templates: jinja2.Environment = field(init=False)
    stylesheet: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.site = auth.SiteThrottle(web_state.WebState(self.db.pool))
        self.passphrases = auth.Passphrases.for_site(self.settings.web)
        self.templates = page_templates()
        self.stylesheet = (resources.files("comfyveil.web") / "static" / "style.css").read_bytes()

    @functools.cached_property
    def policy(self) -> policy_mod.Policy:
        """The content policy, compiled once (the desk's queue asks it)."""
        return policy_mod.Policy(self.settings.policy)

    @property
    def secure_cookies(self) -> bool:
        return (self.settings.web.public_url or "").startswith("https://")

    def parallel(self) -> int:
        """How many jobs run at once, to share out the queue ahead in an ETA."""
        return max(1, len(self.settings.backend_list()))

    def backends_up(self) -> list[str] | None:
        """The backends that can take jobs now, for an ETA."""
        return eta.backends_up(self.pool, self.settings.backend_list())

    def slots(self) -> dict[str, int]:
        """How many jobs each backend holds at once, for an ETA."""
        return eta.slots_of(self.settings.backend_list())


@functools.cache
def page_templates() -> jinja2.Environment:
    """The page templates, one environment per process: it holds nothing of a site (the
    texts follow the request's language, a context variable), so every app a process
    builds shares its compiled pages (the tests build hundreds; each compiled them anew)."""
    templates = jinja2.Environment(
        loader=jinja2.PackageLoader("comfyveil.web", "templates"),
        autoescape=True,
        auto_reload=False,  # templates ship with the package: no stat() per page
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.i18n"],
    )
    # The callables read the request's language (a context variable) when called.
    templates.install_gettext_callables(  # type: ignore[attr-defined]
        i18n.gettext, i18n.ngettext, newstyle=True
    )
    templates.globals["status_word"] = status_word
    # Inside a right-to-left page: commands and ids keep their order (``ltr``, Unicode
    # isolates, fit for attributes and titles too); a name or prompt takes its own
    # direction (``bdi``).
    templates.globals["ltr"] = i18n.ltr
    templates.globals["bdi"] = bdi
    templates.globals["when"] = when
    return templates


SERVICES = web.AppKey("services", WebServices)


@dataclass
class Visit:
    """What one request learnt about its visitor."""

    account: web_store.Account | None = None
    csrf: str = ""  # the session's CSRF token
    # The account's users row, read with the session (None: none yet): its settings and
    # role serve the whole request, so no page reads them again.
    user: users.User | None = None
    session_token: str | None = None
    set_anon_cookie: str | None = None  # a new form cookie to set on the response


VISIT = web.RequestKey("visit", Visit)


def visit(request: web.Request) -> Visit:
    found = request.get(VISIT)
    if found is None:
        found = request[VISIT] = Visit()
    return found


def preferences(request: web.Request) -> dict[str, Any]:
    """The visitor's settings as read with the session ({} for none)."""
    user = visit(request).user
    return dict(user.settings) if user is not None else {}


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
        moment.isoformat(timespec="seconds"),
        text,
    )


HEADER_WORDS = {
    "create": N_("Create"), "history": N_("History"), "gallery": N_("Gallery"),
    "settings": N_("Settings"), "admin": N_("Admin"), "logout": N_("Log out"),
}


@functools.cache
def _header_words(language: str) -> dict[str, str]:
    """Every page's header in `language` (the current one): translated once per language,
    not once per page (template calls are most of a small page's cost)."""
    return {key: i18n._(text) for key, text in HEADER_WORDS.items()}


def render(
    request: web.Request, template: str, *, status: int = 200, **context: Any
) -> web.Response:
    svc = services(request)
    account = visit(request).account
    csrf = visit(request).csrf
    language = i18n.current()
    page = svc.templates.get_template(template).render(
        account=account,
        csrf=csrf,
        path=request.path,
        lang=language,
        dir="rtl" if language in i18n.RTL else "ltr",
        header=_header_words(language),
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


def who_is(request: web.Request) -> access_mod.Who:
    """The signed-in visitor as the access rules see them, from the users row read with
    the session (no second read)."""
    return access_mod.who_with(services(request), require_account(request), visit(request).user)


def require_admin(request: web.Request) -> web_store.Account:
    account = require_account(request)
    if not account.is_admin:
        raise web.HTTPNotFound()
    return account
