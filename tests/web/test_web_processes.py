"""Several web/API processes over one PostgreSQL: whatever one process hands a browser
(a form's token, a session, a job) the other accepts, and the site-wide login throttle
counts the failures every process sees."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from comfyveil.store import accounts, web_tables
from comfyveil.store.web_state import WebState
from comfyveil.web import auth
from tests.fakes.comfyui import FakeComfyUI
from tests.lazy import lazy_import
from tests.web.support import (
    PASSPHRASE,
    cheap_passphrases,
    cli,
    cli_config,
    client,
    csrf_of,
    get_text,
    serving,
    wait_for,
)
from tests.web.test_web_jobs import JOB_URL, submit_form

openai = lazy_import("openai")  # loaded by the first test that uses it


async def test_two_web_processes_on_one_database_serve_one_site(
    fake_comfy: FakeComfyUI, database_url: str, db, tmp_path: Path
) -> None:
    conf = cli_config(tmp_path, database_url, fake_comfy)
    store = web_tables.WebStore(db.pool)
    async with serving(conf) as one, serving(conf) as two, client() as session:
        # the sign-up form comes from one process and is sent to the other
        token = await store.create_invite(is_admin=False, hours=1)
        _, page = await get_text(session, f"{one}/invite/{token}")
        async with session.post(
            f"{two}/invite/{token}",
            data={
                "csrf": csrf_of(page),
                "name": "uma",
                "passphrase": PASSPHRASE,
                "again": PASSPHRASE,
            },
        ) as r:
            assert r.status == 200 and "Log out (uma)" in await r.text()
        _, home = await get_text(session, one + "/")
        async with session.post(one + "/logout", data={"csrf": csrf_of(home)}) as r:
            assert r.status == 200
        # logged out: the login form of one, sent to two
        _, login = await get_text(session, one + "/login")
        async with session.post(
            two + "/login",
            data={"csrf": csrf_of(login), "name": "uma", "passphrase": PASSPHRASE},
        ) as r:
            assert r.status == 200 and "Log out (uma)" in await r.text()
        # a job queued through one, followed on the other
        response = await submit_form(session, one, "f", {"prompt": "a fox", "steps": "1"})
        found = JOB_URL.search(str(response.url))
        assert found, response.url
        job = found.group(1)

        async def done() -> bool:
            status, page = await get_text(session, f"{two}/jobs/{job}")
            return status == 200 and f'src="/jobs/{job}/out/0"' in page

        await wait_for(done, timeout=30)
        # the images API of either process takes a key made on the command line
        code, out, err = await cli(conf, "web", "apikey", "uma", "--label", "cli")
        assert code == 0, err
        key = out.splitlines()[0]
        for url in (one, two):
            api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
            assert "f" in {m.id for m in (await api.models.list()).data}


async def test_the_site_wide_login_throttle_is_shared_by_every_process(db) -> None:
    store = web_tables.WebStore(db.pool)
    one = auth.SiteThrottle(WebState(db.pool), per_minute=2)
    two = auth.SiteThrottle(WebState(db.pool), per_minute=2)  # another process's
    for name in ("nobody", "noone"):
        with pytest.raises(auth.LoginRefused, match="Wrong name"):
            await auth.login(store, one, cheap_passphrases(), name, "whatever passphrase")
    with pytest.raises(auth.LoginRefused, match="Too many failed logins on this site"):
        await auth.login(store, two, cheap_passphrases(), "nobody", "whatever passphrase")
    assert 0 < await two.wait_seconds() <= 60


async def test_every_process_reads_the_same_form_secret(db) -> None:
    first, second = WebState(db.pool), WebState(db.pool)
    made = await asyncio.gather(*(s.secret("forms") for s in (first, second, first)))
    assert len(set(made)) == 1 and len(made[0]) == 32
    cookie = accounts.new_token()
    token = auth.FormTokens(made[0]).token_for(cookie)
    assert auth.FormTokens(made[1]).valid(cookie, token)
    assert not auth.FormTokens().valid(cookie, token)  # a process's own random secret
