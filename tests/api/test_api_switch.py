"""`[api] enabled`: the images API is served beside the pages by default; switched off,
/v1 is not there at all while the pages work as before."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from comfyveil.store import api_keys, web_tables
from tests.fakes.comfyui import FakeComfyUI
from tests.lazy import lazy_import
from tests.web.support import (
    cli,
    cli_config,
    client,
    get_text,
    serving,
    sign_up,
    wait_for,
    web_stack,
)
from tests.web.test_web_jobs import JOB_URL, submit_form

openai = lazy_import("openai")  # loaded by the first test that uses it


async def test_run_serves_the_api_by_default_and_not_when_switched_off(
    fake_comfy: FakeComfyUI, database_url: str, db, tmp_path: Path
) -> None:
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    on = cli_config(tmp_path / "on", database_url, fake_comfy)  # no [api]: the default
    off = cli_config(tmp_path / "off", database_url, fake_comfy)
    off.write_text(off.read_text() + "[api]\nenabled = false\n")
    store = web_tables.WebStore(db.pool)
    async with serving(on) as with_api, serving(off) as without, client() as session:
        await sign_up(
            session,
            f"{without}/invite/{await store.create_invite(is_admin=False, hours=1)}",
            "vera",
        )
        account = await store.account_by_name("vera")
        assert account is not None
        key = await api_keys.ApiKeyStore(db.pool).create(account.id, "test")

        api = openai.AsyncOpenAI(base_url=f"{with_api}/v1", api_key=key, max_retries=0)
        assert "f" in {m.id for m in (await api.models.list()).data}

        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession(headers=headers) as raw:
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/images/generations")):
                async with raw.request(
                    method, without + path, json={"model": "f", "prompt": "a fox"}
                ) as r:
                    assert r.status == 404, path
                    assert (await r.json())["error"]["code"] == "not_found"  # OpenAI's shape
        assert await _job_count(db) == 0  # nothing queued through the switched-off API

        # the pages of the process without the API work as before: a job from the form
        response = await submit_form(session, without, "f", {"prompt": "a fox", "steps": "1"})
        found = JOB_URL.search(str(response.url))
        assert found, response.url

        async def done() -> bool:
            status, page = await get_text(session, f"{without}/jobs/{found.group(1)}")
            return status == 200 and f'src="/jobs/{found.group(1)}/out/0"' in page

        await wait_for(done, timeout=30)
        # its settings page lists the key (to revoke it) but makes no new one
        _, settings = await get_text(session, f"{without}/settings")
        assert key[-4:] in settings and 'action="/settings/keys"' not in settings
        _, settings = await get_text(session, f"{with_api}/settings")
        assert 'action="/settings/keys"' in settings

    # nor does the command line make a key for an API that is off
    code, out, err = await cli(off, "web", "apikey", "vera")
    assert code != 0 and not out.startswith("cv-")
    assert "[api] enabled = false" in err and "Traceback" not in err


async def test_the_settings_form_makes_no_key_while_the_api_is_off(db, fake_comfy) -> None:
    # api=False: what this test is about; the default (on) is the SDK tests' web stack
    async with web_stack(db, [fake_comfy], api=False) as stack, client() as session:
        await sign_up(session, await stack.invite(), "wim")
        _, page = await get_text(session, stack.url + "/settings")
        assert "Make a key" not in page
        csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        async with session.post(
            stack.url + "/settings/keys", data={"csrf": csrf, "label": "x"}
        ) as r:
            assert r.status == 404
        account = await stack.store.account_by_name("wim")
        assert account is not None
        assert await api_keys.ApiKeyStore(db.pool).keys(account.id) == []


async def _job_count(db) -> int:
    async with db.pool.connection() as conn:
        row = await (await conn.execute("SELECT count(*) AS n FROM jobs")).fetchone()
    return int(row["n"])
