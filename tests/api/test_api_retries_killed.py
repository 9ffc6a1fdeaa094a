"""A retry whose first try's process was killed (SIGKILL, an OOM kill, a crash) while
its client waited: the process never noted that its client left, but its presence lock
went with it, so the SDK's retry, sent to another server, takes the first try's job over
instead of paying for a second one."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyveil.store import api_requests, database
from comfyveil.worker import Worker
from tests import zygote
from tests.api import jobs_support
from tests.api.test_api_openai import PROMPT
from tests.api.test_api_retries import openai, statuses
from tests.fakes.comfyui import FakeComfyUI
from tests.web.support import WORKER, cli_config, spawn, wait_for


@contextlib.asynccontextmanager
async def web_serve(conf: Path) -> AsyncIterator[tuple[zygote.Process, str]]:
    """`comfyveil web serve` (the web front end, the API and a worker) in a process of its
    own, and its URL; the test kills it."""
    proc = await spawn(conf, "web", "serve", stderr=asyncio.subprocess.DEVNULL)
    try:
        lines: list[str] = []
        found = None
        while found is None:
            raw = await asyncio.wait_for(proc.stdout.readline(), 60)  # type: ignore[union-attr]
            assert raw, "stdout closed: " + "".join(lines)
            lines.append(raw.decode())
            found = re.search(r"web front end at (http://127\.0\.0\.1:\d+)", lines[-1])
        yield proc, found.group(1)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def settled(db: database.Database) -> None:
    """The database has run long enough for a dead owner to count as dead (just after
    it starts, no process has its lock yet)."""

    async def old_enough() -> bool:
        async with db.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT pg_postmaster_start_time() < now() - make_interval(secs => %(s)s) AS ok",
                {"s": api_requests.SETTLE_IN},
            )
            row = await cursor.fetchone()
        return bool(row and row["ok"])

    await wait_for(old_enough, timeout=30)


async def test_a_retry_after_its_servers_process_was_killed_takes_over_its_job(
    db: database.Database, fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    conf = cli_config(tmp_path, db.url, fake_comfy)
    # the killed process's worker had claimed the job: its lease runs out soon after
    conf.write_text(conf.read_text() + "[worker]\nlease_seconds = 2\n")
    async with jobs_support.stack(db, [fake_comfy], worker=False, retry_grace=300.0) as live:
        key, _ = await live.key("kai")
        await settled(db)
        fake_comfy.pause()  # the job is on the GPU, not done, when its server dies
        async with web_serve(conf) as (proc, url):
            api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
            first = asyncio.create_task(
                api.images.generate(model="f", prompt=PROMPT, size="256x256")
            )

            async def rows() -> list[tuple[int, int]]:
                async with db.pool.connection() as conn:
                    cursor = await conn.execute("SELECT clients, attached FROM api_requests")
                    return [(r["clients"], r["attached"]) for r in await cursor.fetchall()]

            async def on_gpu_and_waited_for() -> bool:
                async with db.pool.connection() as conn:
                    cursor = await conn.execute("SELECT submitted FROM jobs")
                    sent = [r["submitted"] for r in await cursor.fetchall()]
                return sent == [True] and await rows() == [(1, 0)]

            await wait_for(on_gpu_and_waited_for, timeout=60)
            proc.kill()  # SIGKILL: no handler's finally, no note that its client left
            await proc.wait()
            with pytest.raises(openai.APIConnectionError):
                await first
        # The process that replaces it: its worker recovers the job once the lease ends
        runner = Worker(db, live.backends, sinks=[], options=WORKER)
        working = asyncio.create_task(runner.run(), name="replacing-worker")
        try:
            again = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0)
            retry = asyncio.create_task(
                again.images.generate(model="f", prompt=PROMPT, size="256x256")
            )

            async def taken_over() -> bool:
                return await rows() == [(1, 1)] or len(await statuses(live)) > 1

            await wait_for(taken_over, timeout=30)
            fake_comfy.resume()
            result = await asyncio.wait_for(retry, 60)
            assert await statuses(live) == ["succeeded"]  # one job, not two
            assert result.data[0].b64_json

            # two identical requests, both alive, are still two
            both = await asyncio.gather(
                again.images.generate(model="f", prompt=PROMPT, size="256x256"),
                again.images.generate(model="f", prompt=PROMPT, size="256x256"),
            )
            assert all(r.data[0].b64_json for r in both)
            assert await statuses(live) == ["succeeded"] * 3
        finally:
            runner.stop()
            await asyncio.wait_for(working, 30)
