"""Issue 22: the web front end against a cross-site attacker, another account and a
hostile GPU host. Each test here failed on the main of 2026-12-05 before its fix."""

from __future__ import annotations

from aiohttp import web

from tests.web.support import PASSPHRASE, client, get_text, sign_up, web_stack

BOUNDARY = "----cross-site-form"


def latin1_form(**fields: str) -> tuple[bytes, str]:
    """What a cross-site `<form enctype="multipart/form-data" accept-charset="ISO-8859-1">`
    sends when its first field holds "é": the byte 0xE9, which is not UTF-8, then the
    fields the attacker wants a handler to see."""
    parts = [("x", "é".encode("latin-1")), *((k, v.encode()) for k, v in fields.items())]
    body = b"".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
        + value
        + b"\r\n"
        for name, value in parts
    )
    return body + f"--{BOUNDARY}--\r\n".encode(), f"multipart/form-data; boundary={BOUNDARY}"


def post_routes(stack_app: web.Application) -> list[str]:
    paths = []
    for route in stack_app.router.routes():
        if route.method != "POST":
            continue
        info = route.get_info()
        path = info.get("path") or info.get("formatter", "")
        paths.append(
            path.replace("{token}", "t" * 43)
            .replace("{job}", "1")
            .replace("{command}", "f")
            .replace("{action}", "disable")
            .replace("{action:enable|disable}", "disable")
        )
    return paths


async def test_a_body_that_does_not_parse_is_refused_on_every_post_route(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(admin=True), "victim")
        routes = post_routes(stack.site.runner.app)
        assert "/forget" in routes and "/login" in routes and len(routes) >= 14
        body, kind = latin1_form(confirm="yes", account="yes", csrf="", name="victim")
        for path in routes:
            async with session.post(
                stack.url + path, data=body, headers={"Content-Type": kind}
            ) as response:
                assert response.status == 400, (path, response.status)
                assert "could not be read" in await response.text()
        nameless = (
            f"--{BOUNDARY}\r\nContent-Disposition: form-data\r\n\r\nyes\r\n--{BOUNDARY}--\r\n"
        ).encode()
        async with session.post(
            stack.url + "/logout", data=nameless, headers={"Content-Type": kind}
        ) as response:
            assert response.status in (400, 403)
        # nothing happened: the account is there and the session still works
        assert await stack.store.account_by_name("victim") is not None
        status, home = await get_text(session, stack.url + "/")
        assert status == 200 and "victim" in home


async def test_login_csrf_with_no_cookie_at_all_is_refused(db, fake_comfy) -> None:
    """The attacker's own name and passphrase, sent from another site by the victim's
    browser, must not log the victim into the attacker's account."""
    async with web_stack(db, [fake_comfy], worker=False) as stack:
        async with client() as attacker:
            await sign_up(attacker, await stack.invite(), "mallory")
        async with client() as victim:
            body, kind = latin1_form(name="mallory", passphrase=PASSPHRASE)
            async with victim.post(
                stack.url + "/login", data=body, headers={"Content-Type": kind},
                allow_redirects=False,
            ) as response:
                assert response.status == 400
            assert not [c for c in victim.cookie_jar if c.key == "comfyveil_session"]
