"""Issue 22: the web front end against a cross-site attacker, another account and a
hostile GPU host. Each test here failed on the main of 2026-12-05 before its fix."""

from __future__ import annotations

import io
import struct
import uuid
import zlib

from aiohttp import web
from PIL import Image

from comfyveil.store import jobs
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
                stack.url + "/login",
                data=body,
                headers={"Content-Type": kind},
                allow_redirects=False,
            ) as response:
                assert response.status == 400
            assert not [c for c in victim.cookie_jar if c.key == "comfyveil_session"]


# --- results from a hostile GPU host (§6, §12, §15) --------------------------------------


def _png_header_bomb(width: int, height: int) -> bytes:
    """A PNG of `width` x `height` black pixels: a few hundred KB that decode to
    width * height bytes (what a compromised GPU host can send)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    deflate = zlib.compressobj(9)
    row = bytes(width + 1)
    idat = b"".join(deflate.compress(row) for _ in range(height)) + deflate.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _png(colour: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), colour).save(out, "PNG")
    return out.getvalue()


async def _finished_job(stack, user_id: int, outputs: list[jobs.Output]) -> uuid.UUID:
    """A job of `user_id` that a GPU host answered with `outputs`."""
    job = await stack.db.jobs.enqueue(
        jobs.NewJob(
            user_id=user_id,
            chat_id=user_id,
            command="f",
            workflow_hash="h" * 64,
            params={"prompt": "a fox"},
        )
    )
    claimed = await stack.db.jobs.claim("test-worker")
    assert claimed is not None and claimed.id == job.id
    claimed = await stack.db.jobs.mark_submitted(claimed, "gpu-secret-host")
    await stack.db.jobs.complete(claimed, outputs)
    return job.id


async def test_a_thumbnail_bomb_is_refused_before_it_is_decoded(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(), "thea")
        account = await stack.store.account_by_name("thea")
        assert account is not None
        bomb = _png_header_bomb(12_000, 7_000)  # 84 Mpx, over the 40 Mpx default
        assert len(bomb) < 400_000
        job_id = await _finished_job(
            stack,
            account.user_id,
            [
                jobs.Output("b.png", "image", "image/png", bomb),
                jobs.Output("ok.png", "image", "image/png", _png()),
            ],
        )
        async with session.get(f"{stack.url}/jobs/{job_id}/thumb/0") as response:
            assert response.status == 404
        async with session.get(f"{stack.url}/jobs/{job_id}/thumb/1") as response:
            assert response.status == 200 and response.content_type == "image/webp"


async def test_results_are_inline_only_when_their_bytes_are_an_image_or_video(
    db, fake_comfy
) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(), "ursa")
        account = await stack.store.account_by_name("ursa")
        assert account is not None
        page = b"<html><script>alert(document.cookie)</script></html>"
        job_id = await _finished_job(
            stack,
            account.user_id,
            [
                jobs.Output("page.html", "other", "text/html", page),
                jobs.Output("liar.png", "image", "image/png", page),  # named PNG, is HTML
                jobs.Output("real.png", "image", "image/png", _png()),
                jobs.Output("clip.svg", "image", "image/svg+xml", b"<svg onload=alert(1)/>"),
            ],
        )
        for index in (0, 1, 3):
            async with session.get(f"{stack.url}/jobs/{job_id}/out/{index}") as response:
                assert response.status == 200
                assert response.content_type == "application/octet-stream", index
                assert response.headers["Content-Disposition"].startswith("attachment"), index
        async with session.get(f"{stack.url}/jobs/{job_id}/out/2") as response:
            assert response.content_type == "image/png"
            assert response.headers["Content-Disposition"].startswith("inline")


async def test_what_a_user_owns_is_never_cached_and_gpu_names_are_for_admins(
    db, fake_comfy
) -> None:
    async with (
        web_stack(db, [fake_comfy], worker=False) as stack,
        client() as admin,
        client() as user,
    ):
        await sign_up(admin, await stack.invite(admin=True), "ada")
        await sign_up(user, await stack.invite(), "bo")
        for session, name in ((user, "bo"), (admin, "ada")):
            account = await stack.store.account_by_name(name)
            assert account is not None
            job_id = await _finished_job(
                stack, account.user_id, [jobs.Output("a.png", "image", "image/png", _png())]
            )
            for path in ("", "/out/0", "/thumb/0"):
                async with session.get(f"{stack.url}/jobs/{job_id}{path}") as response:
                    assert response.status == 200, path
                    assert response.headers["Cache-Control"] == "no-store", path
                    if not path:
                        page = await response.text()
            assert ("gpu-secret-host" in page) is (name == "ada")
