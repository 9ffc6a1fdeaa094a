"""Signing up with an invitation, logging in and out."""

from __future__ import annotations

from aiohttp import web

from comfyveil.i18n import N_, _
from comfyveil.store import accounts as web_store
from comfyveil.web import auth
from comfyveil.web.page import anon_csrf, render, services, visit


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
    response.set_cookie(
        auth.DEVICE_COOKIE,
        auth.device_token(account),
        httponly=True,
        samesite="Strict",
        path="/",  # read by /login and by /link/TOKEN's login
        max_age=auth.DEVICE_DAYS * 86400,
        secure=svc.secure_cookies,
    )
    raise response


async def login_page(request: web.Request) -> web.Response:
    if visit(request).account is not None:
        raise web.HTTPSeeOther("/")
    return render(request, "login.html", form_csrf=anon_csrf(request), error=None, name="",
                  done=request.query.get("done"))


async def login(request: web.Request) -> web.Response:
    svc = services(request)
    form = await request.post()
    name = _field(form, "name", auth.MAX_NAME * 4).strip()
    passphrase = _field(form, "passphrase", auth.MAX_PASSPHRASE * 4)
    try:
        account = await auth.login(
            svc.web,
            svc.site,
            svc.passphrases,
            name,
            passphrase,
            device=request.cookies.get(auth.DEVICE_COOKIE),
        )
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
        return render(request, "error.html", status=404, message=_(str(web_store.InviteInvalid())))
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
    if not await svc.web.invite_open(token):  # before the 64 MiB hash, not after
        return render(request, "error.html", status=404, message=_(str(web_store.InviteInvalid())))
    if not errors:
        try:
            account = await svc.web.sign_up(token, name, await svc.passphrases.hash(passphrase))
        except web_store.NameTaken as exc:
            errors["name"] = _(str(exc))
        except web_store.InviteInvalid as exc:
            return render(request, "error.html", status=404, message=_(str(exc)))
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
    add_link_routes(app)


# -- a one-time link from the chat (`/web`) ----------------------------------------------


async def link_page(request: web.Request) -> web.Response:
    """What the link does, as a button: Telegram fetches links for previews, so opening
    one must change nothing."""
    svc = services(request)
    token = request.match_info["token"]
    telegram_user = await svc.web.link_user(token)
    if telegram_user is None:
        return render(
            request,
            "error.html",
            status=404,
            message=_("This link is not valid any more; send /web in the chat again."),
        )
    account = visit(request).account
    linked = await svc.web.account_of_user(telegram_user)
    if account is not None:
        # A link never links an account that is signed in: whoever sent /web may not be
        # its owner, and would take it over. Linking starts in Settings, with a code the owner
        # sends to the bot from her own Telegram.
        mode = "already" if account.user_id == telegram_user else "other"
    else:
        mode = "login" if linked is not None else "signup"
    return render(
        request,
        "link.html",
        form_csrf=anon_csrf(request),
        token=token,
        mode=mode,
        linked=linked,
        errors={},
        error=None,
        name="",
    )


async def link(request: web.Request) -> web.Response:
    svc = services(request)
    token = request.match_info["token"]
    form = await request.post()
    action = _field(form, "action", 16)
    account = visit(request).account
    try:
        if action == "login" and account is None:
            telegram_user = await svc.web.link_user(token)
            linked = await svc.web.account_of_user(telegram_user) if telegram_user else None
            if linked is None:
                raise web_store.InviteInvalid(N_("There is no usable account to log into."))
            # The link names the account; its passphrase still opens it (a link alone is no key),
            # with the login's locks and its one answer for every refusal.
            try:
                await auth.login(
                    svc.web,
                    svc.site,
                    svc.passphrases,
                    linked.name,
                    _field(form, "passphrase", auth.MAX_PASSPHRASE * 4),
                    device=request.cookies.get(auth.DEVICE_COOKIE),
                )
            except auth.LoginRefused as exc:
                return render(
                    request,
                    "link.html",
                    status=403,
                    form_csrf=anon_csrf(request),
                    token=token,
                    mode="login",
                    linked=linked,
                    errors={},
                    error=exc.message,
                    name="",
                )
            await svc.web.use_link(token, None)
            return await _start_session(request, linked)
        if action == "signup" and account is None:
            name = _field(form, "name", auth.MAX_NAME * 4).strip()
            passphrase = _field(form, "passphrase", auth.MAX_PASSPHRASE * 4)
            errors: dict[str, str] = {}
            if problem := auth.check_name(name):
                errors["name"] = problem
            if problem := auth.check_passphrase(passphrase, _field(form, "again", 4096)):
                errors["passphrase"] = problem
            if await svc.web.link_user(token) is None:  # before the 64 MiB hash
                raise web_store.InviteInvalid(
                    N_("This link is not valid any more; send /web in the chat again.")
                )
            if not errors:
                try:
                    created = await svc.web.sign_up_linked(
                        token, name, await svc.passphrases.hash(passphrase)
                    )
                except web_store.NameTaken:
                    errors["name"] = _(str(web_store.NameTaken()))
                else:
                    return await _start_session(request, created)
            return render(
                request,
                "link.html",
                status=400,
                form_csrf=anon_csrf(request),
                token=token,
                mode="signup",
                linked=None,
                errors=errors,
                error=None,
                name=name,
            )
    except (web_store.InviteInvalid, web_store.NameTaken) as exc:
        return render(request, "error.html", status=400, message=_(str(exc)))
    raise web.HTTPSeeOther(f"/link/{token}")


def add_link_routes(app: web.Application) -> None:
    app.router.add_get("/link/{token}", link_page)
    app.router.add_post("/link/{token}", link)
