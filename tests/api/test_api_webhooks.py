"""Signed webhooks: deliveries both the standardwebhooks verifier and OpenAI's SDK accept,
one per finished job of the jobs API and endpoint, carrying ids and states but never the
prompt; a receiver that hangs, fails or redirects costs the others nothing; a target on
loopback refused by default."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from comfyveil import config
from comfyveil.api import webhooks as sender_mod
from comfyveil.cli import web as web_cli
from comfyveil.desk import webhook_targets
from comfyveil.store import jobs
from comfyveil.store import webhooks as store
from tests.api.jobs_support import stack
from tests.fakes.socks_relay import SocksRelay
from tests.lazy import lazy_import
from tests.web.support import client, csrf_of, get_text, new_account, sign_up, wait_for, web_stack

openai = lazy_import("openai")
standardwebhooks = lazy_import("standardwebhooks")

PROMPT = "a lighthouse in a storm"
# The receivers of these tests listen on 127.0.0.1 (tests reach no other address), so
# they allow private targets; the refusal with the default has its own test below.
PRIVATE_OK = {"webhook_private_targets": True}


@dataclass
class Receiver:
    url: str
    got: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    most_in_flight: int = 0


@contextlib.asynccontextmanager
async def receiver(behaviour: str = "ok") -> AsyncIterator[Receiver]:
    """A webhook receiver: ok (200), fail (500), hang (never answers), redirect (302 to
    an ok receiver's path on the same server, which must never be followed)."""
    holding = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        rec.in_flight += 1
        rec.most_in_flight = max(rec.most_in_flight, rec.in_flight)
        try:
            rec.got.append((await request.read(), dict(request.headers)))
            rec.arrived.set()
            if behaviour == "hang":
                await holding.wait()
            if behaviour == "fail":
                return web.Response(status=500, text="no")
            if behaviour == "redirect":
                raise web.HTTPFound("/followed")
            return web.Response(text="thanks")
        finally:
            rec.in_flight -= 1

    followed: list[bytes] = []

    async def follow(request: web.Request) -> web.Response:
        followed.append(await request.read())
        return web.Response(text="followed")

    app = web.Application()
    app.router.add_post("/hook", handle)
    app.router.add_post("/followed", follow)
    # a handler ends when its client hangs up: in_flight counts open requests
    runner = web.AppRunner(app, shutdown_timeout=0.1, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rec = Receiver(f"http://127.0.0.1:{port}/hook")
    try:
        yield rec
    finally:
        holding.set()
        assert followed == [], "a redirect was followed"
        await runner.cleanup()


async def _submit(api: aiohttp.ClientSession, url: str, prompt: str = PROMPT) -> dict:
    body = {"command": "f", "prompt": prompt, "options": {"width": 256, "height": 256}}
    async with api.post(url + "/v1/jobs", json=body) as r:
        assert r.status == 202
        return await r.json()


def session(key: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"})


async def _account(db, user_id: int) -> int:
    async with db.pool.connection() as conn:
        cursor = await conn.execute("SELECT id FROM web_accounts WHERE user_id = %s", (user_id,))
        row = await cursor.fetchone()
    return int(row["id"])


async def test_each_end_is_delivered_signed_for_both_verifiers_without_the_prompt(
    db, fake_comfy
) -> None:
    async with stack(db, [fake_comfy], **PRIVATE_OK) as s, receiver() as rec:
        key, user = await s.key()
        account = await _account(db, user)
        hook_id, secret = await store.WebhookStore(db.pool).create(account, rec.url)
        assert secret.startswith("whsec_")
        async with session(key) as api:
            done = await _submit(api, s.url)
            await wait_for(lambda: _true(len(rec.got) == 1))
            fake_comfy.fail_next_execution("KSampler", "CUDA error at 0x7f3a", "RuntimeError")
            failed = await _submit(api, s.url, "a second lighthouse")
            await wait_for(lambda: _true(len(rec.got) == 2))
            # The next job runs long enough to be cancelled: 4 s, of which the cancel (API,
            # database, worker, /interrupt) had 0.9 s with 0.3 s a step, too little on a
            # loaded machine; the fake stops at the next step, as ComfyUI does.
            fake_comfy.step_delay = 1.0
            waiting = await _submit(api, s.url, "a third lighthouse")
            job_url = f"{s.url}/v1/jobs/{waiting['id']}"

            async def stepping() -> bool:
                async with api.get(job_url) as r:
                    return ((await r.json())["progress"]["step"] or 0) >= 1

            await wait_for(stepping)
            async with api.delete(job_url) as r:
                assert r.status == 200
            await wait_for(lambda: _true(len(rec.got) == 3))
        sdk = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
        seen = {}
        for body, headers in rec.got:
            standardwebhooks.Webhook(secret).verify(body, headers)
            sdk.webhooks.verify_signature(body, headers, secret=secret)
            event = json.loads(body)
            seen[event["data"]["id"]] = event["type"]
            assert event["object"] == "event" and event["data"]["object"] == "job"
            assert set(event["data"]) == {"id", "object", "command", "state"}
            assert b"lighthouse" not in body and b"CUDA" not in body
        assert seen == {
            done["id"]: "job.succeeded",
            failed["id"]: "job.failed",
            waiting["id"]: "job.cancelled",
        }
        # a tampered body or another secret is refused by the SDK
        body, headers = rec.got[0]
        with pytest.raises(openai.InvalidWebhookSignatureError):
            sdk.webhooks.verify_signature(body + b" ", headers, secret=secret)
        with pytest.raises(openai.InvalidWebhookSignatureError):
            sdk.webhooks.verify_signature(body, headers, secret=store.new_secret())
        # each was delivered once, and marked so
        rows = await store.WebhookStore(db.pool).deliveries(hook_id)
        assert [r["last_status"] for r in rows] == [200, 200, 200]
        assert all(r["delivered_at"] is not None for r in rows)


async def _true(value: bool) -> bool:
    return value


async def test_a_receiver_that_hangs_fails_or_redirects_costs_the_others_nothing(
    db, fake_comfy, monkeypatch
) -> None:
    monkeypatch.setattr(sender_mod, "TIMEOUT", 3.0)  # a hanging receiver's deadline, shortened
    async with (
        stack(db, [fake_comfy], **PRIVATE_OK) as s,
        receiver("hang") as hanging,
        receiver("fail") as failing,
        receiver("redirect") as redirecting,
        receiver() as good,
    ):
        key, user = await s.key()
        hooks = store.WebhookStore(db.pool)
        account = await _account(db, user)
        ids = {}
        for name, rec in (("hang", hanging), ("fail", failing), ("redirect", redirecting)):
            ids[name], _secret = await hooks.create(account, rec.url)
        ids["good"], _secret = await hooks.create(account, good.url)
        async with session(key) as api:
            first = await _submit(api, s.url)
            await wait_for(lambda: _true(bool(good.got)), timeout=5)
            second = await _submit(api, s.url, "another lighthouse")
            await wait_for(lambda: _true(len(good.got) == 2), timeout=5)
            # while the hanging receiver still holds its first delivery
            assert hanging.in_flight == 1 and len(hanging.got) == 1
        assert {json.loads(b)["data"]["id"] for b, _h in good.got} == {first["id"], second["id"]}
        # the others were tried once each, as they come due, one in flight at a time
        await wait_for(lambda: _true(bool(hanging.got and failing.got and redirecting.got)))
        assert hanging.most_in_flight == 1
        for name, status in (("fail", 500), ("redirect", 302)):
            rows = await hooks.deliveries(ids[name])
            await wait_for(lambda n=name: _tried(hooks, ids[n]))
            rows = await hooks.deliveries(ids[name])
            assert rows[0]["last_status"] == status and rows[0]["delivered_at"] is None
            assert rows[0]["given_up_at"] is None  # to be tried again later, with backoff
        await wait_for(lambda: _tried(hooks, ids["hang"]), timeout=10)
        rows = await hooks.deliveries(ids["hang"])
        assert rows[0]["delivered_at"] is None and rows[0]["last_status"] is None


async def _tried(hooks: store.WebhookStore, hook_id: int) -> bool:
    rows = await hooks.deliveries(hook_id)
    return bool(rows) and rows[0]["attempts"] >= 1


def test_backoff_grows_to_an_hour() -> None:
    assert [sender_mod.retry_in(n) for n in (1, 2, 3)] == [10.0, 20.0, 40.0]
    assert sender_mod.retry_in(20) == 3600.0


async def test_loopback_targets_are_refused_with_the_default(db, database_url, fake_comfy) -> None:
    defaults = config.Settings(database=config.DatabaseConfig(url=database_url))
    assert defaults.api.webhook_private_targets is False  # the promise, with the default
    pia = await new_account(db, "pia")
    for url in (
        "http://127.0.0.1:8080/x",
        "http://localhost/x",
        "http://10.1.2.3/x",
        "http://[::1]/x",
        "http://192.168.1.5/x",
        "ftp://example.com/x",
    ):
        with pytest.raises(webhook_targets.TargetRefused):
            await web_cli.webhook(defaults, "pia", url)
    assert await store.WebhookStore(db.pool).endpoints(pia.id) == []
    # the command line registers a public one and shows its secret once
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        await web_cli.webhook(defaults, "pia", "http://93.184.215.14/hook")
    secret = out.getvalue().splitlines()[0]
    assert secret.startswith("whsec_")
    # and a loopback endpoint already in the table is not sent to with the default
    async with stack(db, [fake_comfy]) as s, receiver() as rec:
        key, user = await s.key()
        hook_id, _secret = await store.WebhookStore(db.pool).create(
            await _account(db, user), rec.url
        )
        async with session(key) as api:
            await _submit(api, s.url)
        await wait_for(lambda: _tried(store.WebhookStore(db.pool), hook_id))
        assert rec.got == []


async def test_an_images_request_whose_client_went_away_is_told_by_webhook(db, fake_comfy) -> None:
    async with stack(db, [fake_comfy], **PRIVATE_OK) as s, receiver() as rec:
        key, user = await s.key()
        hook_id, _secret = await store.WebhookStore(db.pool).create(
            await _account(db, user), rec.url
        )
        async with session(key) as api:
            body = {"model": "f", "prompt": PROMPT, "size": "256x256"}
            async with api.post(s.url + "/v1/images/generations", json=body) as r:
                assert r.status == 200
        (job,) = await db.jobs.list_for_user(user)
        # its client was there to the end: no webhook
        assert await store.WebhookStore(db.pool).deliveries(hook_id) == []
        for _twice in range(2):  # the hook the images API calls when its client went away
            await sender_mod.client_went_away(db, job.id)
        await wait_for(lambda: _true(len(rec.got) == 1))
        event = json.loads(rec.got[0][0])
        assert event["type"] == "job.succeeded" and event["data"]["id"] == str(job.id)
        assert len(await store.WebhookStore(db.pool).deliveries(hook_id)) == 1


async def test_the_settings_page_adds_and_removes_a_webhook_and_refuses_loopback(
    db, fake_comfy
) -> None:
    async with web_stack(db, [fake_comfy], api=True, worker=False) as s, client() as browser:
        await sign_up(browser, await s.invite(), "uma")
        _, page = await get_text(browser, s.url + "/settings")
        form = {"csrf": csrf_of(page), "url": "http://127.0.0.1:9000/hook"}
        async with browser.post(s.url + "/settings/webhooks", data=form) as r:
            refused = await r.text()
            assert r.status == 400 and "loopback or private addresses" in refused
        form["url"] = "https://93.184.215.14/hook"  # a public address; nothing is sent here
        async with browser.post(s.url + "/settings/webhooks", data=form) as r:
            shown = await r.text()
            assert r.status == 200
        secret = shown.split("whsec_", 1)[1].split("<", 1)[0]
        _, again = await get_text(browser, s.url + "/settings")
        assert "https://93.184.215.14/hook" in again and secret not in again
        account = await s.store.account_by_name("uma")
        assert account is not None
        (hook,) = await store.WebhookStore(db.pool).endpoints(account.id)
        assert hook.secret == "whsec_" + secret
        remove = {"csrf": csrf_of(again)}
        async with browser.post(f"{s.url}/settings/webhooks/{hook.id}/remove", data=remove) as r:
            assert r.status == 200
        assert await store.WebhookStore(db.pool).endpoints(account.id) == []


async def test_via_anon_deliveries_leave_through_its_socks_port_and_wait_without_it(
    db,
) -> None:
    relay = await SocksRelay().start()  # stands in for anon's SOCKS port
    # no web server here: the only senders are this test's own
    account = await new_account(db, "vic")
    user = account.user_id
    async with receiver() as rec:
        port = int(rec.url.rsplit(":", 1)[1].split("/", 1)[0])
        # a name only the proxy can reach: nothing resolves it here, and with the
        # default (no private targets) nothing local is called
        hook_id, secret = await store.WebhookStore(db.pool).create(
            account.id, f"http://hooks.test:{port}/hook"
        )
        job = await db.jobs.enqueue(
            jobs.NewJob(
                user_id=user,
                chat_id=user,
                command="f",
                workflow_hash="h" * 64,
                idempotency_key=f"apijob:{user}:x",
            )
        )
        without = sender_mod.Sender(db, private_ok=False, via_anon=True, proxy_url=lambda: None)
        without.start()
        try:
            await db.jobs.cancel(job.id)  # the job ends: its webhook is queued
            await wait_for(lambda: _tried(store.WebhookStore(db.pool), hook_id))
        finally:
            await without.close()
        assert rec.got == [] and relay.targets == []  # never sent directly instead
        async with db.pool.connection() as conn:  # due again now, not in ten seconds
            await conn.execute("UPDATE webhook_deliveries SET next_at = now()")
        via = sender_mod.Sender(
            db,
            private_ok=False,
            via_anon=True,
            proxy_url=lambda: f"socks5h://webhooks:x@{relay.address}",
        )
        via.start()
        try:
            await wait_for(lambda: _true(len(rec.got) == 1))
        finally:
            await via.close()
        assert relay.targets == [("hooks.test", port)]
        body, headers = rec.got[0]
        standardwebhooks.Webhook(secret).verify(body, headers)
        assert json.loads(body)["type"] == "job.cancelled"
    await relay.close()


async def test_an_images_client_that_gives_up_hears_of_its_job_by_webhook(
    db, fake_comfy_factory
) -> None:
    # The SDK's timeout ends the request; the job it queued finishes on the GPU for a retry
    # that never comes, and the account's endpoint hears of its end.
    slow = await fake_comfy_factory(step_delay=0.5)
    async with stack(db, [slow], **PRIVATE_OK) as s, receiver() as rec:
        key, user = await s.key()
        await store.WebhookStore(db.pool).create(await _account(db, user), rec.url)
        async with session(key) as api:
            body = {"model": "f", "prompt": PROMPT, "size": "256x256", "steps": 4}
            with contextlib.suppress(TimeoutError):
                async with api.post(s.url + "/v1/images/generations", json=body,
                                    timeout=aiohttp.ClientTimeout(total=0.5)) as r:
                    await r.read()
        await wait_for(lambda: _true(len(rec.got) == 1), timeout=30)
        (job,) = await db.jobs.list_for_user(user)
        event = json.loads(rec.got[0][0])
        assert event["data"]["id"] == str(job.id)
        assert event["type"] in ("job.succeeded", "job.cancelled")
        assert PROMPT.encode() not in rec.got[0][0]
