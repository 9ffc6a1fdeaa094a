"""What the jobs API's tests share: a web stack whose server can be restarted while the
worker and the GPU go on, a key, and a reader of Server-Sent Events."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp

from comfyveil import config
from comfyveil.cli import run as run_cli
from comfyveil.comfy import pool
from comfyveil.store import api_keys, database
from comfyveil.web import server
from comfyveil.worker import Worker
from tests.fakes.comfyui import FakeComfyUI
from tests.web.support import WORKER, new_account, settings_for


@dataclasses.dataclass
class Stack:
    db: database.Database
    settings: config.Settings
    backends: pool.Pool
    site: server.Running

    @property
    def url(self) -> str:
        return self.site.url

    async def restart(self) -> None:
        """Stop the web server (its streams end) and start another on the same database,
        as a restarted process does; the worker goes on."""
        await self.site.close()
        mounts = run_cli.mounts(self.settings, self.db, self.backends)
        self.site = await server.start(self.settings, self.db, pool=self.backends, mounts=mounts)

    async def key(self, name: str = "ines") -> tuple[str, int]:
        """A key of a new account, and the account's user id."""
        account = await new_account(self.db, name)
        return await api_keys.ApiKeyStore(self.db.pool).create(account.id, "t"), account.user_id

    async def job_count(self) -> int:
        async with self.db.pool.connection() as conn:
            row = await (await conn.execute("SELECT count(*) AS n FROM jobs")).fetchone()
        assert row is not None
        return int(row["n"])


@contextlib.asynccontextmanager
async def stack(
    db: database.Database, comfy: Sequence[FakeComfyUI], *, worker: bool = True, **api: Any
) -> AsyncIterator[Stack]:
    settings = dataclasses.replace(settings_for(comfy), api=config.ApiConfig(enabled=True, **api))
    await db.commands.seed()
    async with pool.Pool(settings.backend_list(), probe_interval=0.2) as backends:
        runner = Worker(db, backends, sinks=[], options=WORKER)
        task = asyncio.create_task(runner.run(), name="api-jobs-worker") if worker else None
        site = await server.start(
            settings, db, pool=backends, mounts=run_cli.mounts(settings, db, backends)
        )
        running = Stack(db, settings, backends, site)
        try:
            yield running
        finally:
            await running.site.close()
            runner.stop()
            if task is not None:
                await asyncio.wait_for(task, 30)


@dataclasses.dataclass
class Event:
    id: str
    event: str
    data: dict[str, Any]


async def events(
    session: aiohttp.ClientSession, url: str, last: str | None = None
) -> AsyncIterator[Event]:
    """The events of a stream until the server ends it."""
    headers = {"Last-Event-ID": last} if last else {}
    async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=60)) as r:
        assert r.status == 200 and r.content_type == "text/event-stream", await r.text()
        fields: dict[str, str] = {}
        async for raw in r.content:
            line = raw.decode().rstrip("\r\n")
            if line:
                name, _sep, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if "data" in fields:
                yield Event(
                    fields.get("id", ""), fields.get("event", ""), json.loads(fields["data"])
                )
            fields = {}
