"""Operating it, end to end: `comfyveil run` and `comfyveil worker` as real processes with
[metrics] on, jobs run against the fake ComfyUI, both scraped with prometheus_client's
parser; /readyz follows the database going away and coming back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from comfyveil.store import database, jobs
from tests import zygote
from tests.integration.test_worker_recovery import _start_again, restartable_pg
from tests.integration.worker_support import enqueue, wait_for, wait_status

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

__all__ = ["restartable_pg"]  # a fixture, used by name below

PROMPT = "a lighthouse at dusk"  # must never show in a metric
USER = 4242001  # nor this id


def write_config(path: Path, db_url: str, comfy_url: str) -> Path:
    path.write_text(
        f'[database]\nurl = "{db_url}"\n\n'
        f'[[backends]]\nname = "gpu0"\nurl = "{comfy_url}"\nvia = "direct"\n\n'
        "[worker]\nlease_seconds = 2.0\npoll_interval = 0.5\n\n"
        "[web]\nport = 0\n\n"
        "[metrics]\nenabled = true\nport = 0\n"
    )
    return path


@contextlib.asynccontextmanager
async def started(*args: str, cwd: Path) -> AsyncIterator[tuple[list[str], str]]:
    """A comfyveil process' output lines (growing while it runs) and the URL of its metrics
    listener (read from what it prints)."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    proc = await zygote.comfyveil(
        *args,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    url = None
    try:
        async with asyncio.timeout(60):
            while url is None:
                line = (await proc.stdout.readline()).decode()
                if not line:
                    raise AssertionError(f"{args[0]} ended before serving metrics: {seen}")
                seen.append(line)
                if match := re.search(r"metrics at (http://\S+)/metrics", line):
                    url = match.group(1)
        drain = asyncio.create_task(_drain(proc, seen))
        try:
            yield seen, url
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)
            drain.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _drain(proc: zygote.Process, seen: list[str]) -> None:
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        seen.append(line.decode())


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    status, text = await get(f"{url}/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(scrapes: list[dict[Any, float]], name: str, **labels: str) -> float:
    """The sum over processes of the samples of `name` whose labels include `labels`."""
    return sum(
        value
        for samples in scrapes
        for (sample, sample_labels), value in samples.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


async def test_run_and_worker_metrics_match_what_happened_and_readyz_follows_the_database(
    restartable_pg: Any, fake_comfy_factory, tmp_path: Path
) -> None:
    from pgserver import _commands

    url = restartable_pg.get_uri()
    conn = await database.connect(url)
    try:
        await database.migrate(conn)
    finally:
        await conn.close()
    db = await database.Database.open(url=url, run_migrations=False, max_size=4)
    fake = await fake_comfy_factory(step_delay=0.05)
    cfg = write_config(tmp_path / "comfyveil.toml", url, fake.url)
    try:
        async with (
            started("run", "--config", str(cfg), cwd=tmp_path) as (_, run_url),
            started(
                "-v",
                "--log-format",
                "json",
                "worker",
                "--config",
                str(cfg),
                "--id",
                "w1",
                cwd=tmp_path,
            ) as (worker_lines, w_url),
        ):
            for probe in ("healthz", "readyz"):
                assert await get(f"{run_url}/{probe}") == (
                    200,
                    "alive\n" if probe == "healthz" else "ready\n",
                )
            assert (await get(f"{w_url}/readyz"))[0] == 200

            ok = [await enqueue(db, prompt=PROMPT, user=USER, seed=i) for i in range(4)]
            for job in ok:
                await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
            fake.fail_next_execution()
            bad = await enqueue(db, prompt=PROMPT, user=USER, seed=99)
            await wait_status(db, bad.id, jobs.Status.FAILED, timeout=30)
            fake.step_delay = 1.0  # long enough to be cancelled while it runs
            slow = await enqueue(db, prompt=PROMPT, user=USER, seed=7, steps=8)

            async def running() -> bool:
                current = await db.jobs.get(slow.id)
                return bool(current and current.submitted)

            await wait_for(running, timeout=30)
            await db.jobs.cancel(slow.id)
            await wait_status(db, slow.id, jobs.Status.CANCELLED, timeout=30)

            async def settled() -> bool:  # the gauges read at scrape time: both workers alive
                both = [await scrape(run_url), await scrape(w_url)]
                return all(s[("comfyveil_workers", ())] == 2 for s in both)

            await wait_for(settled, timeout=20, interval=0.3)
            scrapes = [await scrape(run_url), await scrape(w_url)]

            # Counts: each job counted once, in whichever process ran it.
            assert total(scrapes, "comfyveil_jobs_total", command="f", outcome="succeeded") == 4
            assert total(scrapes, "comfyveil_jobs_total", command="f", outcome="failed") == 1
            assert total(scrapes, "comfyveil_jobs_total", command="f", outcome="cancelled") == 1
            # Histograms: one run per job that ran to its end on gpu0, running from ComfyUI's
            # start as the front ends show it, with the durations the database holds (each
            # run here ends before its running state would have been written: it is kept
            # all the same); one wait per job claimed.
            ended = [await db.jobs.get(j.id) for j in [*ok, bad]]
            ran = [j for j in ended if j and j.executing_at is not None]
            assert len(ran) == 5
            runs = [(j.finished_at - j.executing_at).total_seconds() for j in ran]
            gpu_waits = [(j.executing_at - j.started_at).total_seconds() for j in ran]
            run_labels = {"backend": "gpu0", "command": "f"}
            assert total(scrapes, "comfyveil_job_gpu_wait_seconds_sum", **run_labels) == (
                pytest.approx(sum(gpu_waits), abs=1e-3)
            )
            assert total(scrapes, "comfyveil_job_run_seconds_count", **run_labels) == len(runs)
            assert total(scrapes, "comfyveil_job_run_seconds_sum", **run_labels) == (
                pytest.approx(sum(runs), abs=1e-3)
            )
            assert total(scrapes, "comfyveil_job_run_seconds_bucket", le="+Inf", **run_labels) == (
                len(runs)
            )
            assert total(scrapes, "comfyveil_job_run_seconds_bucket", le="60.0", **run_labels) == (
                sum(1 for r in runs if r <= 60)
            )
            assert total(scrapes, "comfyveil_job_wait_seconds_count", command="f") == 6
            # Gauges read at scrape time, the same in both processes.
            for samples in scrapes:
                assert samples[("comfyveil_queue_jobs", (("state", "queued"),))] == 0
                assert samples[("comfyveil_queue_jobs", (("state", "running"),))] == 0
                assert samples[("comfyveil_backend_up", (("backend", "gpu0"),))] == 1
                assert ("comfyveil_build_info", (("version", "0.1.0"),)) in samples
                labels = " ".join(str(k[1]) for k in samples)
                assert "lighthouse" not in labels and str(USER) not in labels

            # The database stops: neither process is ready; it comes back: both are again.
            def stop() -> None:
                _commands.pg_ctl(
                    ["-w", "-m", "fast", "stop"],
                    pgdata=restartable_pg.pgdata,
                    user=restartable_pg.system_user,
                )

            await asyncio.to_thread(stop)
            for metrics_url in (run_url, w_url):
                status, reason = await get(f"{metrics_url}/readyz")
                assert (status, reason) == (503, "not ready: the database does not answer\n")
            assert (await get(f"{run_url}/healthz"))[0] == 200  # alive all the same
            await asyncio.to_thread(_start_again, restartable_pg)

            async def ready_again() -> bool:
                answers = [await get(f"{u}/readyz") for u in (run_url, w_url)]
                return all(a == (200, "ready\n") for a in answers)

            await wait_for(ready_again, timeout=40, interval=0.5)
        # The worker logged one JSON object a line, with the fields of each extra=.
        logged = [json.loads(line) for line in worker_lines if line.startswith("{")]
        assert any(e.get("action") == "worker_started" and e.get("worker") == "w1" for e in logged)
        assert any(e.get("action") == "job_claimed" and e.get("job_id") for e in logged)
        assert all({"time", "level", "logger", "message"} <= set(e) for e in logged)
        assert not any("lighthouse" in line for line in worker_lines)
    finally:
        await db.close()


async def test_worker_tells_systemd_it_is_ready_pets_the_watchdog_and_says_it_stops(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory()
    cfg = tmp_path / "comfyveil.toml"
    cfg.write_text(
        f'[database]\nurl = "{database_url}"\n\n'
        f'[[backends]]\nname = "gpu0"\nurl = "{fake.url}"\nvia = "direct"\n'
    )
    notify = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.setblocking(False)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    proc = await zygote.comfyveil(
        "worker",
        "--config",
        str(cfg),
        "--id",
        "unit-1",
        cwd=tmp_path,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        # As systemd starts a Type=notify unit with WatchdogSec=2 (pid checked by the child).
        env={**env, "NOTIFY_SOCKET": str(notify), "WATCHDOG_USEC": "2000000"},
    )
    loop = asyncio.get_running_loop()
    messages: list[str] = []
    try:
        async with asyncio.timeout(60):
            while "WATCHDOG=1" not in messages:
                messages.append((await loop.sock_recv(sock, 200)).decode())
        # Ready only once its heartbeat is in the database.
        assert messages[0] == "READY=1\nSTATUS=running"
        assert [b.worker_id for b in await db.heartbeats.all(30)] == ["unit-1"]
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        while "STOPPING=1" not in messages:
            messages.append((await asyncio.wait_for(loop.sock_recv(sock, 200), 5)).decode())
        assert await db.heartbeats.all(30) == []  # a clean stop leaves no row behind
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        sock.close()
