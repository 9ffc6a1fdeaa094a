"""The metrics listener's probes and scrape, with the parts it reads standing in for a
database, a pool and a heartbeat (the end-to-end test uses the real ones)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from comfyveil.metrics import server
from comfyveil.store import errors as store_errors


class Heartbeats:
    def __init__(self, *, down: bool = False) -> None:
        self.down = down

    async def queue_counts(self) -> dict[str, int]:
        if self.down:
            raise store_errors.DatabaseUnreachable("the database does not answer")
        return {"queued": 3, "running": 1}

    async def scrape_counts(self, lease_seconds: float) -> dict[str, int]:
        return {**await self.queue_counts(), "alive": 2}


def parts(*, db_down: bool = False, healthy: bool = True, quiet: float = 0.0) -> server.Parts:
    backend = SimpleNamespace(name="gpu0", healthy=healthy, load=2)
    pool = SimpleNamespace(backends={"gpu0": backend}, any_healthy=healthy)
    beat = SimpleNamespace(last_success=time.monotonic() - quiet)
    db = SimpleNamespace(heartbeats=Heartbeats(down=db_down))
    return server.Parts(db=db, pool=pool, heartbeat=beat, lease_seconds=30.0)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({}, None),
        ({"db_down": True}, "the database does not answer"),
        ({"healthy": False}, "no backend is up"),
        ({"quiet": 45.0}, "this worker has not renewed its heartbeat for 45 s"),
    ],
)
async def test_readiness_names_the_first_thing_wrong(kwargs: dict, reason: str | None) -> None:
    assert await server.MetricsServer("127.0.0.1", 0, parts(**kwargs)).not_ready() == reason


async def test_listener_serves_probes_and_metrics_on_its_own_port() -> None:
    listener = server.MetricsServer("127.0.0.1", 0, parts(healthy=False))
    url = await listener.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/healthz") as r:
                assert (r.status, await r.text()) == (200, "alive\n")
            async with session.get(f"{url}/readyz") as r:
                assert (r.status, await r.text()) == (503, "not ready: no backend is up\n")
            async with session.get(f"{url}/metrics") as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                text = await r.text()
            async with session.post(f"{url}/metrics") as r:
                assert r.status == 405
    finally:
        await listener.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("comfyveil_queue_jobs", (("state", "queued"),))] == 3
    assert samples[("comfyveil_workers", ())] == 2
    assert samples[("comfyveil_backend_up", (("backend", "gpu0"),))] == 0
    assert samples[("comfyveil_backend_busy", (("backend", "gpu0"),))] == 2
    assert ("process_cpu_seconds_total", ()) in samples


async def test_a_port_in_use_is_one_plain_sentence() -> None:
    first = server.MetricsServer("127.0.0.1", 0, parts())
    url = await first.start()
    port = int(url.rsplit(":", 1)[1])
    try:
        with pytest.raises(Exception, match=r"\[metrics\] cannot listen on 127.0.0.1:\d+"):
            await server.MetricsServer("127.0.0.1", port, parts()).start()
    finally:
        await first.close()


def _count(name: str, **labels: str) -> float:
    from comfyveil import metrics

    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_bot_api_answers_are_counted_by_method_and_outcome_429s_apart() -> None:
    from aiohttp import web

    from comfyveil.telegram.request import AiohttpRequest

    async def answer(request: web.Request) -> web.Response:
        if request.match_info["method"] == "sendMessage":
            return web.json_response(
                {"ok": False, "error_code": 429, "parameters": {"retry_after": 1}}, status=429
            )
        return web.json_response({"ok": True, "result": True})

    app = web.Application()
    app.router.add_post("/bot{token}/{method}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    before = (
        _count("comfyveil_telegram_requests_total", method="getMe", outcome="ok"),
        _count("comfyveil_telegram_requests_total", method="sendMessage", outcome="retry_after"),
        _count("comfyveil_telegram_retry_after_total"),
    )
    request = AiohttpRequest()
    await request.initialize()
    try:
        base = f"http://127.0.0.1:{port}/bot123456:secret-token"
        assert (await request.do_request(f"{base}/getMe", "POST"))[0] == 200
        assert (await request.do_request(f"{base}/sendMessage", "POST"))[0] == 429
    finally:
        await request.shutdown()
        await runner.cleanup()
    after = (
        _count("comfyveil_telegram_requests_total", method="getMe", outcome="ok"),
        _count("comfyveil_telegram_requests_total", method="sendMessage", outcome="retry_after"),
        _count("comfyveil_telegram_retry_after_total"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1]


async def test_web_sign_ins_are_counted_by_outcome() -> None:
    import datetime as dt

    from comfyveil.web import auth
    from tests.web.support import cheap_passphrases

    class Accounts:
        def __init__(self, account: object) -> None:
            self.account = account

        async def account_by_name(self, name: str) -> object:
            return self.account if name == "ada" else None

        async def failed_login(self, account_id: int, **_: object) -> None:
            pass

        async def logged_in(self, account_id: int) -> None:
            pass

    passphrases = cheap_passphrases()  # this test counts logins, not argon2's work
    account = SimpleNamespace(
        id=1,
        passphrase=await passphrases.hash("correct horse battery"),
        disabled=False,
        locked_until=None,
        created_at=dt.datetime.now(dt.UTC),
    )
    class Failures:  # the site's failed logins (web_state.WebState keeps them in PostgreSQL)
        def __init__(self) -> None:
            self.count = 0

        async def login_failures(self, window: float) -> tuple[int, float]:
            return self.count, 1.0

        async def login_failed(self, window: float) -> None:
            self.count += 1

    def site(per_minute: int = auth.SITE_FAILURES_PER_MINUTE) -> auth.SiteThrottle:
        return auth.SiteThrottle(Failures(), per_minute=per_minute)  # type: ignore[arg-type]

    store = Accounts(account)
    outcomes = ("succeeded", "failed", "refused")
    before = {o: _count("comfyveil_web_logins_total", outcome=o) for o in outcomes}
    await auth.login(store, site(), passphrases, "ada", "correct horse battery")  # type: ignore[arg-type]
    with pytest.raises(auth.LoginRefused):
        await auth.login(store, site(), passphrases, "ada", "wrong")  # type: ignore[arg-type]
    throttled = site(per_minute=1)
    await throttled.failed()  # the site's one failure a minute is spent: refused before checking
    with pytest.raises(auth.LoginRefused):
        await auth.login(store, throttled, passphrases, "ada", "correct horse battery")  # type: ignore[arg-type]
    after = {o: _count("comfyveil_web_logins_total", outcome=o) for o in outcomes}
    assert {o: after[o] - before[o] for o in outcomes} == {
        "succeeded": 1,
        "failed": 1,
        "refused": 1,
    }


async def test_a_name_not_ours_is_421_so_no_page_reads_metrics_by_dns_rebinding() -> None:
    import socket

    listener = server.MetricsServer("127.0.0.1", 0, parts())
    url = await listener.start()
    port = url.rsplit(":", 1)[1]
    try:
        async with aiohttp.ClientSession() as session:
            for host in ("attacker.example", f"rebind.attacker.example:{port}"):
                async with session.get(f"{url}/metrics", headers={"Host": host}) as r:
                    assert r.status == 421 and "comfyveil_" not in await r.text()
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", socket.gethostname()):
                async with session.get(f"{url}/healthz", headers={"Host": host}) as r:
                    assert r.status == 200, host
    finally:
        await listener.close()
