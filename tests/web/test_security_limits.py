"""One set of limits on every front end: the operator's prompt length, asked in the desk,
and the limits asked before an uploaded image is decoded. Each test here failed on the
main of 2026-12-06 before its fix."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket

import aiohttp
import pytest

from comfyveil import config, errors
from comfyveil.api import answer_slots
from comfyveil.cli import submit as submit_cli
from comfyveil.desk import submit as desk_submit
from comfyveil.store import accounts as web_store
from comfyveil.store import sql, web_invites, web_tables
from comfyveil.web import server as web_server
from tests.api.test_api_openai import make_key, png
from tests.e2e.test_bot_roles import _admins_only
from tests.unit.test_workflow import toy
from tests.web.support import client, csrf_of, get_text, sign_up, wait_for, web_stack
from tests.web.test_web_jobs import submit_form

LONG = "a fox in the snow " * 34  # 612 characters
SAID = "The prompt is 612 characters long; the limit is 50."


def test_a_workflow_without_its_own_max_length_is_bounded_by_the_operators() -> None:
    wf = toy()  # its prompt allows 20 characters, its negative has no max_length
    settings = config.Settings(limits=config.LimitsConfig(max_prompt_length=10))
    with pytest.raises(errors.UsageError, match="negative is too long"):
        desk_submit.validate(settings, wf, {"prompt": "a cat", "negative": "x" * 11})
    with pytest.raises(errors.UsageError, match="prompt is 11 characters long; the limit is 10"):
        desk_submit.validate(settings, wf, {"prompt": "y" * 11})
    roomy = config.Settings(limits=config.LimitsConfig(max_prompt_length=500))
    with pytest.raises(errors.UsageError, match="the limit is 20"):  # the lower one binds
        desk_submit.validate(roomy, wf, {"prompt": "y" * 21})
    assert desk_submit.validate(settings, wf, {"prompt": "a cat"})["prompt"] == "a cat"


async def test_max_prompt_length_refuses_on_the_api_the_web_and_the_cli(db, fake_comfy) -> None:
    # One refusal, in the chat's words, on every front end.
    limits = config.LimitsConfig(max_prompt_length=50)
    async with (
        web_stack(db, [fake_comfy], api=True, worker=False, limits=limits) as stack,
        client() as session,
    ):
        await sign_up(session, await stack.invite(), "lena")
        key = await make_key(session, stack.url)
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession() as api:
            async with api.post(
                stack.url + "/v1/images/generations",
                json={"model": "f", "prompt": LONG},
                headers=headers,
            ) as r:
                body = await r.json()
                assert r.status == 400, body
                assert body["error"]["message"] == SAID
                assert body["error"]["param"] == "prompt"
            form = aiohttp.FormData()
            form.add_field("model", "qwen")
            form.add_field("prompt", LONG)
            form.add_field("image", png(), filename="in.png", content_type="image/png")
            async with api.post(stack.url + "/v1/images/edits", data=form, headers=headers) as r:
                assert r.status == 400 and (await r.json())["error"]["message"] == SAID
        _, form_page = await get_text(session, stack.url + "/c/f")
        assert 'maxlength="50"' in form_page and "up to 50 characters" in form_page
        response = await submit_form(session, stack.url, "f", {"prompt": LONG})
        page = await response.text()
        assert response.status == 400 and SAID in page
        assert await stack.job_count() == 0
        settings = dataclasses.replace(config.Settings(), limits=limits)
        with pytest.raises(errors.UsageError) as refused:
            await submit_cli.build_job(db, settings, "f", [LONG], [], [])
        assert str(refused.value) == SAID


async def test_an_api_edit_asks_the_limits_before_it_decodes_an_image(db, fake_comfy) -> None:
    limits = config.LimitsConfig(daily_quota=1, cooldown=0)
    async with (
        web_stack(db, [fake_comfy], api=True, limits=limits) as stack,
        client() as session,
    ):
        await sign_up(session, await stack.invite(), "mona")
        key = await make_key(session, stack.url)
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession() as api:
            first = {**headers, "Idempotency-Key": "first-one"}
            ask = {"model": "f", "prompt": "a fox"}
            url = stack.url + "/v1/images/generations"
            async with api.post(url, json=ask, headers=first) as r:
                assert r.status == 200, await r.text()
            # the quota is spent: a broken image is not even looked at
            form = aiohttp.FormData()
            form.add_field("model", "qwen")
            form.add_field("prompt", "add a hat")
            form.add_field("image", b"not a png at all", filename="in.png")
            async with api.post(stack.url + "/v1/images/edits", data=form, headers=headers) as r:
                body = await r.json()
                assert r.status == 429, body
                assert "quota" in body["error"]["message"]
            # a retry of the request that spent it is still answered with its job
            async with api.post(url, json=ask, headers=first) as r:
                assert r.status == 200, await r.text()
            async with api.post(url, json=ask, headers={**headers, "Idempotency-Key": "x"}) as r:
                assert r.status == 429
        assert await stack.job_count() == 1


async def test_a_malformed_result_link_is_a_404_never_an_error(db, fake_comfy, caplog) -> None:
    caplog.set_level(logging.WARNING)
    async with (
        web_stack(db, [fake_comfy], api=True) as stack,
        client() as session,
    ):
        await sign_up(session, await stack.invite(), "nils")
        key = await make_key(session, stack.url)
        async with aiohttp.ClientSession() as api:
            async with api.post(
                stack.url + "/v1/images/generations",
                json={"model": "f", "prompt": "a fox", "response_format": "url"},
                headers={"Authorization": f"Bearer {key}"},
            ) as r:
                url = (await r.json())["data"][0]["url"]
            base, _, query = url.partition("?")
            sig = query.partition("&sig=")[2]
            for bad in (
                f"expires=%C2%B2&sig={sig}",  # "²": a digit to str.isdigit, not to int
                f"expires={'9' * 5000}&sig={sig}",
                "expires=99999999999&sig=%C3%A9",  # a non-ASCII signature
                f"sig={sig}",
            ):
                async with api.get(f"{base}?{bad}") as r:
                    assert r.status == 404, (bad, await r.text())
            async with api.get(url) as r:
                assert r.status == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_chunked_json_body_is_capped_by_the_bytes_read(db, fake_comfy) -> None:
    async with (
        web_stack(db, [fake_comfy], api=True) as stack,
        client() as session,
    ):
        await sign_up(session, await stack.invite(), "olaf")
        key = await make_key(session, stack.url)

        async def body():  # no Content-Length: aiohttp sends it chunked
            yield b'{"model": "f", "prompt": "a fox", "pad": "'
            for _ in range(80):
                yield b"x" * 65536
            yield b'"}'

        async with (
            aiohttp.ClientSession() as api,
            api.post(
                stack.url + "/v1/images/generations",
                data=body(),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            ) as r,
        ):
            assert r.status == 413, await r.text()
        assert await stack.job_count() == 0


async def test_an_admins_only_commands_form_is_a_404_for_a_user(db, fake_comfy) -> None:
    await _admins_only(db, "sd3")
    async with web_stack(db, [fake_comfy], worker=False) as stack:
        async with client() as user:
            await sign_up(user, await stack.invite(), "pete")
            unknown = await get_text(user, stack.url + "/c/nosuch")
            status, page = await get_text(user, stack.url + "/c/sd3")
            assert (status, page) == unknown and unknown[0] == 404
            response = await submit_form_to(user, stack.url, "sd3", {"prompt": "a fox"})
            assert response.status == 404
        async with client() as admin:
            await sign_up(admin, await stack.invite(admin=True), "root")
            status, page = await get_text(admin, stack.url + "/c/sd3")
            assert status == 200 and 'id="f-prompt"' in page
        assert await stack.job_count() == 0


async def submit_form_to(
    session: aiohttp.ClientSession, url: str, command: str, fields: dict[str, str]
) -> aiohttp.ClientResponse:
    """A form sent without its page (the attacker read the options elsewhere)."""
    _, home = await get_text(session, url + "/")
    return await session.post(f"{url}/c/{command}", data={"csrf": csrf_of(home), **fields})


async def test_one_first_admin_link_at_most_and_none_once_an_account_exists(db) -> None:
    settings = config.Settings()
    store = web_tables.WebStore(db.pool)

    async def open_invites() -> list[web_invites.Invite]:
        return [i for i in await store.invites() if i.used_at is None]

    said = await web_server.first_invite(settings, db, "http://x", terminal=False)
    assert said is not None and "comfyveil web invite --admin" in said and "/invite/" not in said
    assert await open_invites() == []  # no link is made for a journal to keep
    links = []
    for _start in range(3):  # three starts on a terminal
        said = await web_server.first_invite(settings, db, "http://x", terminal=True)
        assert said is not None
        links.append(said.rpartition(" ")[2])
    assert len(await open_invites()) == 1  # the newest only
    token = links[-1].rpartition("/")[2]
    assert [await store.invite_open(link.rpartition("/")[2]) for link in links] == [
        False,
        False,
        True,
    ]
    # `comfyveil web invite --admin` before any account replaces it too
    other = await store.create_invite(is_admin=True, hours=1)
    assert not await store.invite_open(token) and await store.invite_open(other)
    await store.sign_up(other, "root", "x")
    # an account exists: no first-admin link stays open, and a start makes none
    assert await open_invites() == []
    assert await web_server.first_invite(settings, db, "http://x", terminal=True) is None
    # an admin's invitation after that is an ordinary one, kept
    later = await store.create_invite(is_admin=True, hours=1)
    assert await store.invite_open(later)
    await web_server.first_invite(settings, db, "http://x", terminal=True)
    assert await store.invite_open(later)


async def test_the_web_port_answers_its_own_names_only(db, fake_comfy) -> None:
    async with (
        web_stack(
            db, [fake_comfy], api=True, worker=False, public_url="https://cv.example.org"
        ) as stack,
        client() as session,
    ):
        port = stack.site.port
        url = f"http://127.0.0.1:{port}"  # stack.url is the public one
        for path in ("/", "/v1/models", "/static/style.css"):
            async with session.get(
                url + path, headers={"Host": f"rebind.attacker.example:{port}"}
            ) as r:
                assert r.status == 421, path
        for host in (
            f"127.0.0.1:{port}",
            "cv.example.org",
            f"localhost:{port}",
            f"{socket.gethostname()}.local:{port}",
        ):
            async with session.get(url + "/", headers={"Host": host}, allow_redirects=False) as r:
                assert r.status in (200, 303), (host, r.status)


async def test_replays_of_one_account_are_answered_a_few_at_a_time(db, fake_comfy) -> None:
    async with (
        web_stack(db, [fake_comfy], api=True, worker=False) as stack,
        client() as session,
    ):
        await sign_up(session, await stack.invite(), "rita")
        account = await stack.store.account_by_name("rita")
        assert account is not None
        key = await make_key(session, stack.url)
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "same-one"}
        ask = {"model": "f", "prompt": "a fox", "n": 1}
        url = stack.url + "/v1/images/generations"
        async with aiohttp.ClientSession() as api:

            async def post() -> tuple[int, dict]:
                async with api.post(url, json=ask, headers=headers) as r:
                    return r.status, await r.json()

            waiting = [asyncio.create_task(post()) for _ in range(answer_slots.MAX_ANSWERING)]

            async def all_in() -> bool:  # each holds a slot, and their one job is queued
                return answer_slots.answering(account.id) == len(waiting) and bool(
                    await stack.db.jobs.list_for_user(account.user_id)
                )

            await wait_for(all_in, timeout=30)
            status, body = await asyncio.wait_for(post(), 10)  # one more replay
            assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body
            (job,) = await stack.db.jobs.list_for_user(account.user_id)
            await stack.db.jobs.cancel(job.id, by_user=account.user_id)
            answers = await asyncio.gather(*waiting)
        assert [s for s, _ in answers] == [500] * len(waiting)  # the cancelled job, said
        assert answer_slots.answering(account.id) == 0


async def test_migration_0023_keeps_one_old_first_admin_link_and_none_after_an_account(
    db,
) -> None:
    """Earlier versions added a first-admin invitation at every start without an account."""
    (sql_text,) = [text for version, _, text in sql.migrations() if version == "0023"]
    store = web_tables.WebStore(db.pool)
    old = []
    async with db.pool.connection() as conn:
        for age in (3, 2, 1):  # hours ago: three starts
            token = web_store.new_token()
            await conn.execute(
                "INSERT INTO web_invites (token_hash, is_admin, created_at, expires_at) "
                "VALUES (%(h)s, true, now() - make_interval(hours => %(age)s), "
                "now() + interval '1 day')",
                {"h": web_store.digest(token), "age": age},
            )
            old.append(token)
        await conn.execute(sql_text)
    assert [await store.invite_open(t) for t in old] == [False, False, True]
    await store.sign_up(old[-1], "root", "x")
    later = await store.create_invite(is_admin=True, hours=1)  # an admin's, after that
    async with db.pool.connection() as conn:
        token = web_store.new_token()  # one left open by an earlier version, say
        await conn.execute(
            "INSERT INTO web_invites (token_hash, is_admin, created_at, expires_at) "
            "VALUES (%(h)s, true, now() - interval '5 hours', now() + interval '1 day')",
            {"h": web_store.digest(token)},
        )
        await conn.execute(sql_text)
    assert not await store.invite_open(token)  # made before the first account: closed
    assert await store.invite_open(later)  # made after it: an ordinary one, kept
