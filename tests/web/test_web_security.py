"""Issue 22: the web front end against a cross-site attacker, another account and a
hostile GPU host. Each test here failed on the main of 2026-12-05 before its fix."""

from __future__ import annotations

import asyncio
import io
import struct
import time
import uuid
import zlib

import pytest
from aiohttp import web
from PIL import Image

from comfyveil import config, policy
from comfyveil.comfy import notrace
from comfyveil.store import jobs
from comfyveil.web import app as web_app
from comfyveil.web import auth
from tests.web.support import (
    CSRF,
    PASSPHRASE,
    cheap_passphrases,
    client,
    csrf_of,
    get_text,
    sign_up,
    wait_for,
    web_stack,
)

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


async def _finished_job(
    stack, user_id: int, outputs: list[jobs.Output], *, command: str = "f", prompt: str = "a fox"
) -> uuid.UUID:
    """A job of `user_id` that a GPU host answered with `outputs`."""
    job = await stack.db.jobs.enqueue(
        jobs.NewJob(
            user_id=user_id,
            chat_id=user_id,
            command=command,
            workflow_hash="h" * 64,
            params={"prompt": prompt, "seed": 1},  # as a real /f job has
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


# --- guessing, probing and locking out (§4, §5) ----------------------------------------


async def _login(session, url: str, name: str, passphrase: str) -> tuple[int, str]:
    """The answer to a login, without what differs by design (the CSRF token, the name
    typed back into its field)."""
    _, page = await get_text(session, url + "/login")
    async with session.post(
        url + "/login", data={"csrf": csrf_of(page), "name": name, "passphrase": passphrase}
    ) as response:
        return response.status, CSRF.sub("", await response.text()).replace(name, "NAME")


async def test_a_real_name_and_an_unknown_one_get_the_same_answers(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack:
        async with client() as session:
            await sign_up(session, await stack.invite(), "alice")
        answers: dict[str, list[tuple[int, str]]] = {"alice": [], "nobody": []}
        async with client() as guesser:
            for name, seen in answers.items():
                for n in range(auth.FREE_FAILURES + 3):
                    seen.append(await _login(guesser, stack.url, name, f"wrong guess {n}"))
        assert answers["alice"] == answers["nobody"]
        # the right passphrase from a new browser during the lock: the same answer again
        async with client() as stranger:
            assert await _login(stranger, stack.url, "alice", PASSPHRASE) == answers["alice"][-1]
            assert not [c for c in stranger.cookie_jar if c.key == auth.SESSION_COOKIE]


async def test_a_browser_that_signed_in_before_is_never_locked_out(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as owner:
        # A site limit of 5, not 30: the lock's exemption is tested, not 30 argon2 runs
        # (test_web_accounts.py holds the throttle to its default of 30).
        throttle = web_app.services_of(stack.site.runner.app).site
        throttle.per_minute = 5
        home = await sign_up(owner, await stack.invite(), "olga")
        await owner.post(stack.url + "/logout", data={"csrf": csrf_of(home)})
        async with client() as attacker:  # locks the account, then the whole site
            for n in range(throttle.per_minute + 2):
                await _login(attacker, stack.url, "olga", f"wrong guess {n}")
            status, _page = await _login(attacker, stack.url, "olga", PASSPHRASE)
            assert status == 403
        status, page = await _login(owner, stack.url, "olga", PASSPHRASE)
        assert status == 200 and "Log out (NAME)" in page
        # ... with her own passphrase only
        _, home = await get_text(owner, stack.url + "/")
        await owner.post(stack.url + "/logout", data={"csrf": csrf_of(home)})
        status, _page = await _login(owner, stack.url, "olga", "wrong guess again")
        assert status == 403


async def test_no_passphrase_is_hashed_for_an_invitation_or_link_that_is_not_open(
    db, fake_comfy, monkeypatch
) -> None:
    hashed: list[str] = []
    real = auth.Passphrases.hash

    async def counting(self: auth.Passphrases, passphrase: str) -> str:
        hashed.append(passphrase)
        return await real(self, passphrase)

    monkeypatch.setattr(auth.Passphrases, "hash", counting)
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        _, page = await get_text(session, stack.url + "/login")
        fields = {
            "csrf": csrf_of(page),
            "name": "eve",
            "passphrase": PASSPHRASE,
            "again": PASSPHRASE,
            "action": "signup",
        }
        for path in ("/invite/" + "x" * 43, "/link/" + "x" * 43):
            async with session.post(stack.url + path, data=fields) as response:
                assert response.status in (400, 404), path
        assert hashed == []
        await sign_up(session, await stack.invite(), "eve")  # an open one still hashes
        assert len(hashed) == 1


async def test_passphrase_hashes_run_at_most_a_few_at_once() -> None:
    running = peak = 0
    passphrases = cheap_passphrases()
    real = passphrases.hasher

    class Counting:
        def hash(self, passphrase: str) -> str:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            try:
                time.sleep(0.01)  # long enough for the others to start, were they allowed
                return real.hash(passphrase)
            finally:
                running -= 1

    passphrases.hasher = Counting()  # type: ignore[assignment]
    await asyncio.gather(*(passphrases.hash(f"passphrase {n}") for n in range(8)))
    assert 1 <= peak <= auth.HASHES_AT_ONCE


# --- forgetting (§14) --------------------------------------------------------------------


async def test_delete_everything_cleans_the_gpu_hosts_at_once(db, fake_comfy) -> None:
    """The web's "Delete everything" does what the chat's /forget does: what a finished
    job left on a GPU host (written down when the host could not be cleaned then) is
    removed now, not at the next hourly sweep."""
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        home = await sign_up(session, await stack.invite(), "fay")
        account = await stack.store.account_by_name("fay")
        assert account is not None
        job_id = await _finished_job(
            stack, account.user_id, [jobs.Output("a.png", "image", "image/png", _png())]
        )
        left = fake_comfy.dirs["output"] / "fay_00001_.png"
        left.write_bytes(_png())
        await stack.db.traces.record(
            job_id, "gpu0", [notrace.Trace(kind="output", name=left.name, folder="output")]
        )
        async with session.post(
            stack.url + "/forget", data={"csrf": csrf_of(home), "confirm": "yes"}
        ) as response:
            assert response.status == 200

        async def gone() -> bool:  # overwritten with a blank placeholder, struck out
            return left.read_bytes() == notrace.PLACEHOLDER_PNG and not await db.traces.settled()

        await wait_for(gone, timeout=10)


# --- one policy for every way into the queue (§3) ----------------------------------------


async def test_every_web_way_into_the_queue_checks_the_policy(db, fake_comfy) -> None:
    """The form, "Run again" and "Edit this" refuse what the chat refuses (the chat's
    own ways, /again, the re-roll button and `comfyveil submit`, are walked in
    tests/e2e/test_bot_policy.py)."""
    rules = policy.from_table({"terms": ["gore"]})
    async with (
        web_stack(db, [fake_comfy], worker=False, policy=rules) as stack,
        client() as session,
    ):
        await sign_up(session, await stack.invite(), "pat")
        account = await stack.store.account_by_name("pat")
        assert account is not None
        refusal = "This bot does not accept that prompt; nothing was queued."
        # the form
        _, page = await get_text(session, stack.url + "/c/f")
        async with session.post(
            stack.url + "/c/f", data={"csrf": csrf_of(page), "prompt": "a g0re scene"}
        ) as response:
            assert response.status == 400 and refusal in await response.text()
        # "Run again" of a job queued before the operator added the term
        old = await _finished_job(
            stack,
            account.user_id,
            [jobs.Output("a.png", "image", "image/png", _png())],
            prompt="a gore scene",
        )
        before = await stack.job_count()
        async with session.post(
            f"{stack.url}/jobs/{old}/again", data={"csrf": csrf_of(page)}
        ) as response:
            assert response.status == 400 and refusal in await response.text()
        # "Edit this" on a result
        _, edit = await get_text(session, f"{stack.url}/c/qwen?from={old}:0")
        async with session.post(
            stack.url + "/c/qwen",
            data={"csrf": csrf_of(edit), "prompt": "add some gore", "image__from": f"{old}:0"},
        ) as response:
            assert response.status == 400 and refusal in await response.text()
        assert await stack.job_count() == before
        counts = {c.command: c.total for c in await stack.db.refusals.counts()}
        assert counts == {"f": 2, "qwen": 1}


# --- one access rule for both front ends (§13) -----------------------------------------


async def test_a_linked_telegram_user_needs_the_chats_allow_on_the_web_too(db, fake_comfy) -> None:
    """A closed bot (`[telegram] open = false`, not on `allow`): a web account linked to
    a Telegram user who may not use the chat may not queue from the web either; an
    invited account still may, and /allow lets the linked one in."""
    closed = config.TelegramConfig(open=False, allow=())
    async with (
        web_stack(db, [fake_comfy], worker=False, telegram=closed) as stack,
        client() as linked,
        client() as invited,
    ):
        await sign_up(linked, await stack.invite(), "lin")
        await sign_up(invited, await stack.invite(), "inv")
        account = await stack.store.account_by_name("lin")
        assert account is not None
        await stack.store.use_link(await stack.store.create_link(5005, minutes=5), account.id)
        for session, expected in ((linked, 400), (invited, 200)):
            _, page = await get_text(session, stack.url + "/c/f")
            async with session.post(
                stack.url + "/c/f",
                data={"csrf": csrf_of(page), "prompt": "a fox", "width": "256", "height": "256"},
            ) as response:
                text = await response.text()
                assert response.status == expected, text
                assert ("not allowed to use this service" in text) is (expected == 400)
        assert await stack.job_count() == 1
        await stack.db.users.update_settings(5005, {"allowed": True})  # an admin's /allow
        _, page = await get_text(linked, stack.url + "/c/f")
        async with linked.post(
            stack.url + "/c/f",
            data={"csrf": csrf_of(page), "prompt": "a fox", "width": "256", "height": "256"},
        ) as response:
            assert response.status == 200


async def test_every_way_into_the_queue_goes_through_the_one_policy(
    fake_telegram, db, fake_comfy
) -> None:
    """Issue 22 §3: the chat (/f, an edit with a photo, /again, the re-roll button),
    the web (the form, Run again, Edit this) and `comfyveil submit`, all against the
    policy in force now."""
    from comfyveil.cli import submit as submit_cli
    from comfyveil.telegram import callbacks_data
    from tests.e2e.bot_support import SMALL, png, running_bot

    refused = "This bot does not accept that prompt; nothing was queued."
    async with running_bot(fake_telegram, db, [fake_comfy]) as bot:  # before the policy
        bot.send(90, f"/f a storm over gore point {SMALL}")
        first = await bot.result(90)
    rules = policy.from_table({"terms": ["gore"]})
    async with (
        running_bot(fake_telegram, db, [fake_comfy], worker=False, policy=rules) as bot,
        web_stack(db, [fake_comfy], worker=False, policy=rules) as stack,
        client() as session,
    ):
        before = await stack.job_count()
        said = 0

        async def refused_in_chat() -> None:
            nonlocal said
            said += 1
            await fake_telegram.wait_for(
                lambda _: (
                    sum(m.get("text") == refused for m in fake_telegram.bot_messages(90)) >= said
                )
            )

        bot.send(90, f"/f a g0re scene {SMALL}")  # the chat
        await refused_in_chat()
        bot.send(90, document=(png(), "in.png", "image/png"), caption="/qwen add some gore")
        await refused_in_chat()  # an edit
        bot.send(90, "/again")
        await refused_in_chat()
        job_id = (await db.jobs.list_for_user(90, limit=1))[0].id
        query = fake_telegram.user_presses(
            90, first.result["message_id"], callbacks_data.again(job_id)
        )  # the re-roll button
        await fake_telegram.wait_for(lambda _: query in fake_telegram.callback_answers)
        assert fake_telegram.callback_answers[query]["text"] == refused
        with pytest.raises(policy.PromptRefused):  # comfyveil submit
            await submit_cli.build_job(
                db, config.Settings(policy=rules), "f", ["a", "gore", "scene"], [], []
            )
        # the web: the form, Run again and Edit this of a job from before the policy
        await sign_up(session, await stack.invite(), "walker")
        account = await stack.store.account_by_name("walker")
        assert account is not None
        old = await _finished_job(
            stack,
            account.user_id,
            [jobs.Output("a.png", "image", "image/png", _png())],
            prompt="a gore scene",
        )
        _, page = await get_text(session, stack.url + "/c/f")
        for path, data in (
            ("/c/f", {"prompt": "a gore scene"}),
            (f"/jobs/{old}/again", {}),
            ("/c/qwen", {"prompt": "add some gore", "image__from": f"{old}:0"}),
        ):
            async with session.post(
                stack.url + path, data={"csrf": csrf_of(page), **data}
            ) as response:
                assert response.status == 400 and refused in await response.text(), path
        assert await stack.job_count() == before + 1  # only the web job made for the test
