"""The web front end for tests: PostgreSQL, a worker, a fake ComfyUI and the web server on
127.0.0.1 (a real TCP port, so both aiohttp clients and Chromium can reach it)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from comfyveil import config
from comfyveil.cli import run as run_cli
from comfyveil.comfy import pool
from comfyveil.store import accounts as web_store
from comfyveil.store import database
from comfyveil.web import auth, server
from comfyveil.worker import Worker, WorkerOptions
from tests.fakes.comfyui import FakeComfyUI

WORKER = WorkerOptions(
    lease_seconds=5.0,
    poll_interval=0.5,
    shutdown_grace=5.0,
    retry_backoff=0.05,
    recover_interval=0.5,
    delivery_grace=1.0,
    job_timeout=60.0,
)
PASSPHRASE = "correct horse battery staple"
# argon2 at 1 MiB and one pass, not the default 64 MiB and three: a default hash or check
# costs 0.27 s of CPU, and these tests make about 150 of them. The default cost has its
# own tests (test_web_accounts.py: a sign-up and login at the defaults, the stored hash's
# parameters, the unknown name's hash), and `comfyveil run` in subprocesses keeps it.
CHEAP_PASSPHRASES = {"passphrase_memory_mib": 1, "passphrase_iterations": 1}


def cheap_passphrases() -> auth.Passphrases:
    return auth.Passphrases.for_site(config.WebConfig(**CHEAP_PASSPHRASES))


CSRF = re.compile(r'name="csrf" value="([^"]+)"')
NONCE = re.compile(r'name="nonce" value="([^"]+)"')


def settings_for(comfy: Sequence[FakeComfyUI], **web_options: Any) -> config.Settings:
    backends = tuple(
        config.BackendConfig(name=f"gpu{i}", url=fake.url, via="direct")
        for i, fake in enumerate(comfy)
    )
    limits = web_options.pop("limits", config.LimitsConfig(cooldown=0))
    extra = {k: web_options.pop(k) for k in ("policy", "telegram") if k in web_options}
    web = config.WebConfig(**({"host": "127.0.0.1", "port": 0} | CHEAP_PASSPHRASES | web_options))
    return config.Settings(backends=backends, limits=limits, web=web, **extra)


@dataclasses.dataclass
class WebStack:
    url: str
    db: database.Database
    store: web_store.WebStore
    site: server.Running

    async def invite(self, *, admin: bool = False) -> str:
        token = await self.store.create_invite(is_admin=admin, hours=1)
        return f"{self.url}/invite/{token}"

    async def job_count(self) -> int:
        async with self.db.pool.connection() as conn:
            cursor = await conn.execute("SELECT count(*) AS n FROM jobs")
            row = await cursor.fetchone()
        assert row is not None
        return int(row["n"])


@contextlib.asynccontextmanager
async def web_stack(
    db: database.Database,
    comfy: Sequence[FakeComfyUI],
    *,
    worker: bool = True,
    api: bool | config.ApiConfig = False,
    **web_options: Any,
) -> AsyncIterator[WebStack]:
    """The web front end; `api`: with the images API under /v1 (`[api] enabled`, off here
    unless asked: these tests are of the pages; or the whole [api] table), composed as
    `comfyveil run` does."""
    api_config = api if isinstance(api, config.ApiConfig) else config.ApiConfig(enabled=api)
    settings = dataclasses.replace(settings_for(comfy, **web_options), api=api_config)
    await db.commands.seed()
    async with pool.Pool(settings.backend_list(), probe_interval=0.2) as backends:
        runner = Worker(db, backends, sinks=[], options=WORKER)
        task = asyncio.create_task(runner.run(), name="web-worker") if worker else None
        mounts = run_cli.mounts(settings, db, backends)
        site = await server.start(settings, db, pool=backends, mounts=mounts)
        try:
            yield WebStack(site.url, db, web_store.WebStore(db.pool), site)
        finally:
            await site.close()
            runner.stop()
            if task is not None:
                await asyncio.wait_for(task, 30)


def client() -> aiohttp.ClientSession:
    # unsafe: the jar keeps cookies of an IP address host (127.0.0.1), as a browser does
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, "the page has a form with a CSRF token"
    return found.group(1)


async def get_text(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as response:
        return response.status, await response.text()


async def sign_up(
    session: aiohttp.ClientSession, invite_url: str, name: str, passphrase: str = PASSPHRASE
) -> str:
    """Use an invitation; the home page's HTML (logged in)."""
    _, page = await get_text(session, invite_url)
    async with session.post(
        invite_url,
        data={
            "csrf": csrf_of(page),
            "name": name,
            "passphrase": passphrase,
            "again": passphrase,
        },
    ) as response:
        text = await response.text()
        assert response.status == 200, text
        return text


async def wait_for(
    check: Callable[[], Awaitable[bool]], timeout: float = 20.0, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)
