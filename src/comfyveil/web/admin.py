"""Admin pages: accounts (quotas, bans, admin rights), invitations, backends, workflows.

Only accounts marked admin see them; to anyone else they do not exist (404). Quotas
and bans are the store's own (`users.daily_quota`, role `banned`), the ones `/quota` and
`/ban` set in the chat, so a linked Telegram user is limited alike. Banning an account
also ends its sessions at once.
"""

from __future__ import annotations

import uuid

from aiohttp import web

from comfyveil import errors
from comfyveil.comfy import health, workflow
from comfyveil.desk.words import role_word, source_word
from comfyveil.i18n import N_, _
from comfyveil.models import local as model_files
from comfyveil.store import commands as commands_store
from comfyveil.web.page import render, require_admin, services

MAX_WORKFLOW_BYTES = 2 * 1024 * 1024  # a TOML or an API-format graph JSON
# What the users page says after each action (the action is the redirect's ?done=).
DONE = {
    "quota": N_("The quota was set."),
    "ban": N_("The account was banned and its sessions ended."),
    "unban": N_("The account was unbanned."),
    "make-admin": N_("The account may now use the admin pages."),
    "revoke-admin": N_("The account may no longer use the admin pages."),
}


async def overview(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    return render(
        request,
        "admin/index.html",
        queued=await svc.db.jobs.queue_length(),
        accounts=await svc.web.account_count(),
    )


async def users(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    return render(
        request,
        "admin/users.html",
        rows=await svc.web.accounts(),
        default_quota=svc.settings.limits.daily_quota,
        message=_(DONE[done]) if (done := request.query.get("done", "")) in DONE else None,
        role_word=role_word,
        # the chat's answer to "has this user limits?", from the desk
        exempt=lambda r: svc.access.exempt(r["user_id"], r["role"], web_admin=r["is_admin"]),
    )


async def _account_id(request: web.Request) -> int:
    form = await request.post()
    try:
        return int(str(form.get("account", "")))
    except ValueError:
        raise web.HTTPNotFound() from None


async def user_action(request: web.Request) -> web.Response:
    admin = require_admin(request)
    svc = services(request)
    form = await request.post()
    account = await svc.web.account(await _account_id(request))
    if account is None:
        raise web.HTTPNotFound()
    action = request.match_info["action"]
    if action == "quota":
        raw = str(form.get("quota", "")).strip()
        if raw and (not raw.isdigit() or int(raw) > 1_000_000):
            return render(
                request,
                "error.html",
                status=400,
                message=_("A quota is a whole number of jobs a day, or empty."),
            )
        await svc.db.users.set_daily_quota(account.user_id, int(raw) if raw else None)
    elif action in ("ban", "unban"):
        if account.id == admin.id:
            return render(request, "error.html", status=400, message=_("You cannot ban yourself."))
        banned = action == "ban"
        await svc.web.set_disabled(account.id, banned)
        await svc.db.users.set_role(account.user_id, "banned" if banned else "user")
    elif action in ("make-admin", "revoke-admin"):
        if account.id == admin.id:
            return render(
                request,
                "error.html",
                status=400,
                message=_("You cannot change your own admin rights."),
            )
        await svc.web.set_admin(account.id, action == "make-admin")
    else:
        raise web.HTTPNotFound()
    raise web.HTTPSeeOther(f"/admin/users?done={action}")


async def invites(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    return render(request, "admin/invites.html", invites=await svc.web.invites(), link=None)


async def invite_create(request: web.Request) -> web.Response:
    admin = require_admin(request)
    svc = services(request)
    form = await request.post()
    token = await svc.web.create_invite(
        is_admin=form.get("admin") == "yes",
        hours=svc.settings.web.invite_hours,
        created_by=admin.id,
    )
    # The address the admin reached us by (a hidden service's, or 127.0.0.1's), unless
    # the operator named the public one.
    base = svc.settings.web.public_url or f"{request.scheme}://{request.host}"
    return render(
        request,
        "admin/invites.html",
        invites=await svc.web.invites(),
        link=f"{base}/invite/{token}",
    )


async def invite_revoke(request: web.Request) -> web.Response:
    require_admin(request)
    form = await request.post()
    await services(request).web.revoke_invite(str(form.get("ref", ""))[:16])
    raise web.HTTPSeeOther("/admin/invites")


async def backends(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    rows = []
    entries = await svc.registry.all()
    if svc.pool is not None:
        # An admin looking is often one who just installed a model: read the lists anew.
        await svc.pool.refresh_models(max_age=health.LOOK_REFRESH)
        for backend in svc.pool.backends.values():
            missing: list[tuple[str, list[str], str | None]] = []
            if backend.object_info is not None:
                for entry in entries:
                    problems = backend.problems(entry.workflow)
                    if problems:
                        hint = model_files.install_hint(entry.workflow, problems)
                        missing.append((entry.name, problems, hint))
            rows.append({"b": backend, "missing": missing})
    return render(
        request,
        "admin/backends.html",
        rows=rows,
        pool=svc.pool,
        queued=await svc.db.jobs.queue_length(),
        workers=await svc.db.heartbeats.all(svc.settings.worker.lease_seconds),
    )


async def workflows(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    return render(
        request,
        "admin/workflows.html",
        commands=await svc.db.commands.list(),
        error=None,
        added=request.query.get("added"),
        source_word=source_word,
    )


async def workflow_toggle(request: web.Request) -> web.Response:
    require_admin(request)
    svc = services(request)
    form = await request.post()
    try:
        await svc.db.commands.set_enabled(
            str(form.get("command", "")), request.match_info["action"] == "enable"
        )
    except commands_store.CommandNotFound:
        raise web.HTTPNotFound() from None
    await svc.registry.refresh()
    raise web.HTTPSeeOther("/admin/workflows")


def _upload_text(form: object, name: str) -> str | None:
    field = form.get(name) if hasattr(form, "get") else None  # type: ignore[union-attr]
    if not isinstance(field, web.FileField) or not field.filename:
        return None
    data = field.file.read(MAX_WORKFLOW_BYTES + 1)
    if len(data) > MAX_WORKFLOW_BYTES:
        raise errors.UsageError(
            _("{file} is larger than 2 MB.").format(file=field.filename[:100]))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.UsageError(
            _("{file} is not UTF-8 text.").format(file=field.filename[:100])) from None


async def workflow_add(request: web.Request) -> web.Response:
    """Add a command from an uploaded TOML and its API-format JSON, checked as
    `comfyveil workflows add` checks them."""
    require_admin(request)
    svc = services(request)
    form = await request.post()
    try:
        toml_text = _upload_text(form, "toml")
        graph_text = _upload_text(form, "graph")
        if toml_text is None or graph_text is None:
            raise errors.UsageError(
                _("Choose both files: the NAME.toml and its NAME.json."))
        toml_field = form.get("toml")
        assert isinstance(toml_field, web.FileField)
        stem = toml_field.filename.rsplit("/", 1)[-1].removesuffix(".toml") or "workflow"
        if not stem.replace("_", "").replace("-", "").replace(".", "").isalnum():
            stem = f"workflow_{uuid.uuid4().hex[:8]}"
        wf = workflow.loads(stem, toml_text, graph_text)
    except (errors.UsageError, workflow.WorkflowError) as exc:
        return render(
            request,
            "admin/workflows.html",
            status=400,
            commands=await svc.db.commands.list(),
            error=str(exc),
            added=None,
            source_word=source_word,
        )
    added = await svc.db.commands.add(
        wf, toml_text, graph_text, enabled=form.get("enable") == "yes"
    )
    await svc.registry.refresh()
    raise web.HTTPSeeOther(f"/admin/workflows?added={added.command}")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin", overview)
    app.router.add_get("/admin/users", users)
    app.router.add_post("/admin/users/{action}", user_action)
    app.router.add_get("/admin/invites", invites)
    app.router.add_post("/admin/invites", invite_create)
    app.router.add_post("/admin/invites/revoke", invite_revoke)
    app.router.add_get("/admin/backends", backends)
    app.router.add_get("/admin/workflows", workflows)
    app.router.add_post("/admin/workflows/add", workflow_add)
    app.router.add_post("/admin/workflows/{action:enable|disable}", workflow_toggle)
