"""The settings page's webhook endpoints: add one (its secret shown once) and remove one.
Which addresses are allowed is the desk's rule, the same as `comfyveil web webhook`'s."""

from __future__ import annotations

from aiohttp import web

from comfyveil.desk import webhook_targets
from comfyveil.i18n import _
from comfyveil.store import webhooks
from comfyveil.web import job_pages
from comfyveil.web.page import preferences, require_account, services


async def webhook_create(request: web.Request) -> web.Response:
    account = require_account(request)
    svc = services(request)
    if not svc.settings.api.enabled:
        raise web.HTTPNotFound()  # [api] enabled = false: no webhook to send
    form = await request.post()
    url = str(form.get("url") or "").strip()
    store = webhooks.WebhookStore(svc.db.pool)
    api = svc.settings.api
    prefs = preferences(request)
    try:
        if len(await store.endpoints(account.id)) >= webhooks.MAX_PER_ACCOUNT:
            raise webhook_targets.TargetRefused(
                _("An account has at most {n} webhooks; remove one first.").format(
                    n=webhooks.MAX_PER_ACCOUNT
                )
            )
        await webhook_targets.check(
            url, private_ok=api.webhook_private_targets, resolve=api.webhooks_via != "anon"
        )
    except webhook_targets.TargetRefused as exc:
        return await job_pages._settings(request, prefs, {"webhook": str(exc)}, saved=False)
    _id, secret = await store.create(account.id, url)
    return await job_pages._settings(request, prefs, {}, saved=False, new_secret=secret)


async def webhook_remove(request: web.Request) -> web.Response:
    account = require_account(request)
    try:
        hook_id = int(request.match_info["hook"])
    except ValueError:
        raise web.HTTPNotFound() from None
    if not await webhooks.WebhookStore(services(request).db.pool).remove(account.id, hook_id):
        raise web.HTTPNotFound()
    raise web.HTTPSeeOther("/settings#webhooks")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/settings/webhooks", webhook_create)
    app.router.add_post("/settings/webhooks/{hook}/remove", webhook_remove)
