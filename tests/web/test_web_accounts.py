"""Accounts of the web front end: invitations, sign-up, login, sessions, CSRF, headers."""

from __future__ import annotations

import pytest
from argon2.exceptions import VerifyMismatchError

from comfyveil import config, config_load
from comfyveil.store.web_state import WebState
from comfyveil.web import app as web_app
from comfyveil.web import auth
from tests.web.support import (
    PASSPHRASE,
    cheap_passphrases,
    client,
    csrf_of,
    get_text,
    sign_up,
    web_stack,
)


async def test_security_headers_on_every_response_and_no_server_header(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        for path in ("/login", "/static/style.css", "/no/such/page", "/"):
            async with session.get(stack.url + path, allow_redirects=False) as response:
                for name, value in web_app.HEADERS.items():
                    assert response.headers.get(name) == value, (path, name)
                assert "Server" not in response.headers, path
        _, page = await get_text(session, stack.url + "/login")
        assert "<script" not in page and "style=" not in page
        assert '<meta name="viewport"' in page


# The argon2 cost a site gets unless its operator sets another (the other tests' is cheaper).
DEFAULT_PASSPHRASES = {"passphrase_memory_mib": 64, "passphrase_iterations": 3}


def test_the_default_passphrase_cost_is_rfc_9106s_second_recommendation() -> None:
    defaults = config.WebConfig()
    assert (defaults.passphrase_memory_mib, defaults.passphrase_iterations) == (64, 3)
    assert config_load.from_mapping({}).web == defaults


async def test_invitation_signs_up_once_and_logs_in(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False, **DEFAULT_PASSPHRASES) as stack:
        invite = await stack.invite()
        async with client() as alice:
            home = await sign_up(alice, invite, "alice")
            assert "Log out (alice)" in home
            cookie = next(c for c in alice.cookie_jar if c.key == auth.SESSION_COOKIE)
            assert cookie["httponly"] and cookie["samesite"] == "Strict"
        async with client() as mallory:
            status, page = await get_text(mallory, invite)
            assert status == 404 and "not valid" in page
        account = await stack.store.account_by_name("ALICE")
        assert account is not None and account.user_id < -(1 << 62)
        assert account.passphrase.startswith("$argon2id$v=19$m=65536,t=3,p=4$")
        async with client() as again:  # the passphrase opens the account at the default cost
            status, page = await _login(again, stack.url, "alice", PASSPHRASE)
            assert status == 200 and "Log out (alice)" in page
        async with client() as guesser:
            status, page = await _login(guesser, stack.url, "alice", "not the passphrase")
            assert status == 403 and "Log out" not in page


@pytest.mark.parametrize(("memory_mib", "iterations"), [(64, 3), (1, 1), (19, 2)])
async def test_an_unknown_name_is_checked_at_the_cost_of_a_real_passphrase(
    memory_mib: int, iterations: int
) -> None:
    """A wrong name must cost what a wrong passphrase costs, or timing tells which names
    exist: the stand-in hash an unknown name is checked against has the site's parameters."""
    passphrases = auth.Passphrases(memory_mib, iterations)
    real = await passphrases.hash("a passphrase of someone's")
    parameters = real.split("$")[:4]
    assert passphrases.dummy_hash.split("$")[:4] == parameters
    assert parameters[3] == f"m={memory_mib * 1024},t={iterations},p=4"
    # A valid hash that does not match: argon2 runs in full (an invalid one would be
    # refused at once, and the refusal of an unknown name would be quick).
    with pytest.raises(VerifyMismatchError):
        passphrases.hasher.verify(passphrases.dummy_hash, "a passphrase of someone's")
    assert not await passphrases.verify(None, "a passphrase of someone's")
    assert not await passphrases.verify(real, "another one")
    assert await passphrases.verify(real, "a passphrase of someone's")
    assert passphrases.dummy_hash != auth.Passphrases(memory_mib, iterations).dummy_hash


async def test_signup_errors_are_beside_the_fields(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        invite = await stack.invite()
        _, page = await get_text(session, invite)
        async with session.post(
            invite,
            data={
                "csrf": csrf_of(page),
                "name": "bad name!",
                "passphrase": "short",
                "again": "x",
            },
        ) as response:
            text = await response.text()
        assert response.status == 400
        assert 'id="e-name"' in text and 'id="e-passphrase"' in text
        assert await stack.store.invite_open(invite.rsplit("/", 1)[1]), "invite still usable"


async def _login(session, url: str, name: str, passphrase: str) -> tuple[int, str]:
    _, page = await get_text(session, url + "/login")
    async with session.post(
        url + "/login",
        data={
            "csrf": csrf_of(page),
            "name": name,
            "passphrase": passphrase,
        },
    ) as response:
        return response.status, await response.text()


async def test_failed_logins_slow_down_the_account(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack:
        async with client() as session:
            await sign_up(session, await stack.invite(), "bob")
        async with client() as guesser:
            for _ in range(auth.FREE_FAILURES):
                status, page = await _login(guesser, stack.url, "bob", "wrong guess 123")
                assert status == 403 and "Wrong name or passphrase" in page
            status, page = await _login(guesser, stack.url, "bob", "wrong guess 124")
            assert status == 403
            # Now even the right passphrase waits until the lock ends, with the same
            # sentence as a wrong one (a browser that signed in before is let in: see
            # test_web_security).
            status, page = await _login(guesser, stack.url, "bob", PASSPHRASE)
            assert status == 403 and "Wrong name or passphrase" in page
        async with client() as other:  # another account is not slowed by bob's guesser
            await sign_up(other, await stack.invite(), "carol")
            await other.post(
                stack.url + "/logout",
                data={"csrf": csrf_of((await get_text(other, stack.url + "/"))[1])},
            )
            status, page = await _login(other, stack.url, "carol", PASSPHRASE)
            assert status == 200 and "Log out (carol)" in page


async def test_site_wide_throttle_refuses_logins_after_many_failures(db) -> None:
    site = auth.SiteThrottle(WebState(db.pool), per_minute=3)
    store = __import__("comfyveil.store.web_tables", fromlist=["WebStore"]).WebStore(db.pool)
    for _ in range(3):
        with pytest.raises(auth.LoginRefused, match="Wrong name"):
            await auth.login(store, site, cheap_passphrases(), f"nobody{_}", "whatever passphrase")
    with pytest.raises(auth.LoginRefused, match="Too many failed logins on this site"):
        await auth.login(store, site, cheap_passphrases(), "nobody", "whatever passphrase")


async def test_the_site_throttle_holds_from_its_default_of_30_failures_a_minute(db) -> None:
    site = auth.SiteThrottle(WebState(db.pool))  # the default the web front end uses
    for _ in range(auth.SITE_FAILURES_PER_MINUTE - 1):
        await site.failed()
    assert await site.wait_seconds() == 0
    await site.failed()
    assert 0 < await site.wait_seconds() <= 60


async def test_post_without_csrf_token_is_refused(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await get_text(session, stack.url + "/login")  # has the form cookie, not the token
        async with session.post(
            stack.url + "/login", data={"name": "x", "passphrase": "y"}
        ) as response:
            assert response.status == 403
            assert "did not come from this site" in await response.text()
        await sign_up(session, await stack.invite(), "dave")
        async with session.post(stack.url + "/c/f", data={"prompt": "a fox"}) as response:
            assert response.status == 403
        async with session.post(
            stack.url + "/c/f", data={"prompt": "a fox", "csrf": "forged"}
        ) as response:
            assert response.status == 403
        assert await stack.job_count() == 0


async def test_logout_ends_the_session_and_expired_sessions_do_not_count(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(), "erin")
        token = next(c.value for c in session.cookie_jar if c.key == auth.SESSION_COOKIE)
        assert await stack.store.session(token) is not None
        _, home = await get_text(session, stack.url + "/")
        async with session.post(stack.url + "/logout", data={"csrf": csrf_of(home)}) as r:
            assert r.url.path == "/login"
        assert await stack.store.session(token) is None
        account = await stack.store.account_by_name("erin")
        assert account is not None
        expired, _ = await stack.store.create_session(account.id, hours=-1)
        async with client() as other:
            other.cookie_jar.update_cookies({auth.SESSION_COOKIE: expired})
            async with other.get(stack.url + "/", allow_redirects=False) as response:
                assert response.status == 303 and response.headers["Location"] == "/login"


async def test_a_malformed_request_gets_the_headers_and_no_server_version(db, fake_comfy) -> None:
    import asyncio
    from urllib.parse import urlsplit

    async with web_stack(db, [fake_comfy], worker=False) as stack:
        parts = urlsplit(stack.url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.write(b"GARBAGE / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = (await asyncio.wait_for(reader.read(4096), 10)).decode("latin-1")
        writer.close()
        assert head.startswith("HTTP/1.") and " 400 " in head.splitlines()[0]
        headers = head.split("\r\n\r\n", 1)[0].lower()
        assert "\r\nserver:" not in headers and "aiohttp" not in headers
        assert "content-security-policy: default-src 'none'" in headers




async def test_the_site_stops_every_time_it_is_stopped(db, fake_comfy) -> None:
    # A stop racing the commands table's first read once hung shutdown for good (a
    # cancel swallowed by the connection pool's wait on Python 3.11): each round asks
    # one quick question and stops the site, where that race lives.
    import asyncio
    from urllib.parse import urlsplit

    async def one_round() -> None:
        async with web_stack(db, [fake_comfy], worker=False) as stack:
            parts = urlsplit(stack.url)
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            writer.write(b"GARBAGE / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = (await reader.read(4096)).decode("latin-1")
            writer.close()
            assert " 400 " in head.splitlines()[0]

    for round_ in range(15):
        # asyncio.wait, not a timeout: the hang swallowed the timeout's cancel as well
        running = asyncio.create_task(one_round())
        done, _ = await asyncio.wait({running}, timeout=15)
        assert done, f"round {round_}: the site did not stop"
        running.result()
