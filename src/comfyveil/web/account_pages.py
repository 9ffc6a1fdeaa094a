"""Signing up with an invitation, logging in and out."""

from __future__ import annotations

from aiohttp import web

from comfyveil.web import auth
from comfyveil.web import store as web_store
from comfyveil.web.app import anon_csrf, render, services, visit


def _field(form: object, name: str, limit: int = 2048) -> str:
    value = form.get(name) if hasattr(form, "get") else None  # type: ignore[union-attr]
    return value[:limit] if isinstance(value, str) else ""


async def _start_session(request: web.Request, account: web_store.Account) -> web.Response:
    svc = services(request)
    hours = svc.settings.web.session_hours
    token, _csrf = await svc.web.create_session(account.id, hours=hours)
    response = web.HTTPSeeOther("/")
    response.set_cookie(
        auth.SESSION_COOKIE,
        token,
        httponly=True,
        samesite="Strict",
        path="/",
        max_age=int(hours * 3600),
        secure=svc.secure_cookies,
    )
    response.del_cookie(auth.ANON_COOKIE, path="/")
    raise response


async def login_page(request: web.Request) -> web.Response:
    if visit(request).account is not None:
        raise web.HTTPSeeOther("/")
    return render(request, "login.html", form_csrf=anon_csrf(request), error=None, name="")


async def login(request: web.Request) -> web.Response:
    svc = services(request)
    form = await request.post()
    name = _field(form, "name", auth.MAX_NAME * 4).strip()
    passphrase = _field(form, "passphrase", auth.MAX_PASSPHRASE * 4)
    try:
        account = await auth.login(svc.web, svc.site, name, passphrase)
    except auth.LoginRefused as exc:
        return render(
            request,
            "login.html",
            status=403,
            form_csrf=anon_csrf(request),
            error=exc.message,
            name=name,
        )
    return await _start_session(request, account)


async def logout(request: web.Request) -> web.Response:
    svc = services(request)
    token = visit(request).session_token
    if token:
        await svc.web.end_session(token)
    response = web.HTTPSeeOther("/login")
    response.del_cookie(auth.SESSION_COOKIE, path="/")
    raise response


async def signup_page(request: web.Request) -> web.Response:
    svc = services(request)
    token = request.match_info["token"]
    if not await svc.web.invite_open(token):
        return render(request, "error.html", status=404, message=str(web_store.InviteInvalid()))
    return render(
        request, "signup.html", form_csrf=anon_csrf(request), token=token, errors={}, name=""
    )


async def signup(request: web.Request) -> web.Response:
    svc = services(request)
    token = request.match_info["token"]
    form = await request.post()
    name = _field(form, "name", auth.MAX_NAME * 4).strip()
    passphrase = _field(form, "passphrase", auth.MAX_PASSPHRASE * 4)
    again = _field(form, "again", auth.MAX_PASSPHRASE * 4)
    errors: dict[str, str] = {}
    if problem := auth.check_name(name):
        errors["name"] = problem
    if problem := auth.check_passphrase(passphrase, again):
        errors["passphrase"] = problem
    if not errors:
        try:
            account = await svc.web.sign_up(token, name, await auth.hash_passphrase(passphrase))
        except web_store.NameTaken as exc:
            errors["name"] = str(exc)
        except web_store.InviteInvalid as exc:
            return render(request, "error.html", status=404, message=str(exc))
        else:
            return await _start_session(request, account)
    return render(
        request,
        "signup.html",
        status=400,
        form_csrf=anon_csrf(request),
        token=token,
        errors=errors,
        name=name,
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_get("/invite/{token}", signup_page)
    app.router.add_post("/invite/{token}", signup)
