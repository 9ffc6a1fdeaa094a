"""What every handler of the images API shares: its services and the caller of a
request (the key's account)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from comfyveil import config, i18n
from comfyveil import policy as policy_mod
from comfyveil.api.errors import ApiError
from comfyveil.api.retries import Sweeper, Visits
from comfyveil.api.waiter import Waiter
from comfyveil.comfy import pool as pool_mod
from comfyveil.desk import access as access_mod
from comfyveil.desk import language as language_mod
from comfyveil.desk import registry as registry_mod
from comfyveil.i18n import _
from comfyveil.store import accounts, api_keys, api_requests, database, previews, web_tables
from comfyveil.store.presence import Presence


@dataclass
class ApiServices:
    settings: config.Settings
    db: database.Database
    access: access_mod.Access
    registry: registry_mod.CommandRegistry
    policy: policy_mod.Policy
    web: web_tables.WebStore
    keys: api_keys.ApiKeyStore
    pool: pool_mod.Pool | None = None
    waiter: Waiter = field(init=False)
    # this process's presence lock: the rows its clients wait on name its key, so a
    # retry elsewhere takes them over as soon as the process dies
    presence: Presence = field(init=False)
    requests: api_requests.ApiRequestStore = field(init=False)
    previews: previews.PreviewStore = field(init=False)
    sweeper: Sweeper = field(init=False)
    visits: Visits = field(init=False)
    # notes that a request's client is done, written after its answer (see retries.leave)
    leaving: set[asyncio.Task[None]] = field(default_factory=set)
    link_secret: bytes = b""  # read from the database at start, shared by every process

    def __post_init__(self) -> None:
        self.waiter = Waiter(self.db)
        self.presence = Presence(self.db.url)
        self.requests = api_requests.ApiRequestStore(self.db.pool, owner=self.presence.key)
        self.previews = previews.PreviewStore(self.db.pool)
        api = self.settings.api
        self.sweeper = Sweeper(self.requests, grace=api.retry_grace, keep=api.retry_keep)
        self.visits = Visits(self.requests, self.leaving)


SERVICES = web.AppKey("api_services", ApiServices)
ACCOUNT = web.RequestKey("api_account", accounts.Account)


def services(request: web.Request) -> ApiServices:
    return request.app[SERVICES]


async def caller(request: web.Request) -> tuple[ApiServices, access_mod.Who]:
    """The key's account as the desk sees it, speaking its language.

    Raises:
        ApiError: 401 for a missing, unknown or revoked key (or a banned account).
    """
    svc = services(request)
    scheme, _sep, key = request.headers.get("Authorization", "").partition(" ")
    found = await svc.keys.account(key.strip()) if scheme.lower() == "bearer" else None
    if found is None:
        raise ApiError(
            401,
            _("That API key is not valid: make one on the settings page of the web front end."),
            code="invalid_api_key",
        )
    account, user = found
    who = access_mod.who_with(svc, account, user)
    i18n.set_language(language_mod.choose(who.settings, request.headers.get("Accept-Language")))
    request[ACCOUNT] = account
    return svc, who
