"""Workers riding out a PostgreSQL restart, and re-delivering what a crash left undelivered."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from comfyveil import sinks
from comfyveil.store import database, jobs
from tests.integration.worker_support import (
    enqueue,
    never,
    running_worker,
    wait_for,
    wait_status,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.fixture
async def restartable_pg() -> AsyncIterator[Any]:
    """A PostgreSQL of this test's own, so it can be restarted.

    Its files live outside pytest's temp folder: pgserver runs postgres as its own
    system user, which cannot enter pytest's 0700 folders.
    """
    root = Path(tempfile.mkdtemp(prefix="comfyveil-pg-restart-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    server = None
    for attempt in range(3):  # initdb now and then fails when many servers start at once
        try:
            server = await asyncio.to_thread(
                pgserver.get_server, root / f"pg{attempt}", cleanup_mode="stop"
            )
            break
        except Exception:
            if attempt == 2:
                raise
            await asyncio.sleep(1.0)
    assert server is not None
    try:
        yield server
    finally:
        await asyncio.to_thread(server.cleanup)
        shutil.rmtree(root, ignore_errors=True)


async def test_postgres_restarted_under_load_no_job_is_lost(
    restartable_pg: Any, fake_comfy_factory
) -> None:
    from pgserver import _commands

    url = restartable_pg.get_uri()
    conn = await database.connect(url)
    try:
        await database.migrate(conn)
    finally:
        await conn.close()
    db = await database.Database.open(url=url, run_migrations=False, max_size=8)
    fakes = [await fake_comfy_factory(step_delay=0.05) for _ in range(2)]
    urls = [f.url for f in fakes]
    try:
        queued = [await enqueue(db, prompt=f"job {i}", seed=i, steps=4) for i in range(16)]
        # Files on the GPU host, not images over the WebSocket: a prompt that finishes while
        # the database is down has no worker listening, and with no trace its images would
        # be gone (README, Paying once); this test is about not paying twice otherwise.
        async with (
            running_worker(db, urls, no_trace=False),
            running_worker(db, urls, no_trace=False),
        ):
            await wait_status(db, queued[2].id, jobs.Status.SUCCEEDED, timeout=30)

            def stop() -> None:
                _commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=restartable_pg.pgdata,
                                 user=restartable_pg.system_user)

            await asyncio.to_thread(stop)
            await asyncio.sleep(1.5)  # workers keep running against a dead database
            await asyncio.to_thread(_start_again, restartable_pg)
            for job in queued:
                await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=60)
        ran = fakes[0].executions + fakes[1].executions
        assert set(ran) == {str(j.id) for j in queued}
        assert all(count == 1 for count in ran.values()), ran
    finally:
        await db.close()


async def test_a_result_finished_but_never_delivered_is_delivered_once(
    db: database.Database, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory()
    job = await enqueue(db)
    # A worker that completed the job and died before its sink ran.
    claimed = await db.jobs.claim("crashed-worker")
    assert claimed is not None and claimed.id == job.id
    await db.jobs.complete(claimed, [jobs.Output("x.png", "image", "image/png", b"\x89PNGdata")])
    sink = sinks.FileSink(tmp_path / "out")
    async with running_worker(db, [fake.url], delivery=[sink]):
        await wait_for(lambda: _true(len(sink.delivered) == 1), timeout=10)
        # Several more deliver-loop rounds: a second delivery would show now.
        await never(lambda: _true(len(sink.delivered) > 1), within=1.5)
    assert len(sink.delivered) == 1
    assert sink.delivered[0].read_bytes() == b"\x89PNGdata"
    assert await db.jobs.undelivered("files") == []
    assert not fake.executions


def _start_again(server: Any) -> None:
    for attempt in range(3):
        try:
            server.ensure_postgres_running()
            return
        except Exception:
            if attempt == 2:
                raise
            time.sleep(1.0)


async def _true(value: bool) -> bool:
    return value
