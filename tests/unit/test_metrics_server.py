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

    async def alive(self, lease_seconds: float) -> int:
        return 2


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
