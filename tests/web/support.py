"""The web front end for tests: PostgreSQL, a worker, a fake ComfyUI and the web server on
127.0.0.1 (a real TCP port, so both aiohttp clients and Chromium can reach it)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from comfyveil import config
from comfyveil.cli import run as run_cli
from comfyveil.comfy import pool
from comfyveil.store import accounts as web_store
from comfyveil.store import database, web_tables
from comfyveil.web import auth, server
from comfyveil.worker import Worker, WorkerOptions
from tests import zygote
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
    store: web_tables.WebStore
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
            yield WebStack(site.url, db, web_tables.WebStore(db.pool), site)
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


async def new_account(
    db: database.Database, name: str, *, admin: bool = False
) -> web_store.Account:
    """An account made in the store by an invitation's sign-up, for tests that need one
    but not its pages (it never logs in: its passphrase hash is none)."""
    store = web_tables.WebStore(db.pool)
    token = await store.create_invite(is_admin=admin, hours=1)
    return await store.sign_up(token, name, "not-a-hash: this account never logs in")


# --- the command line, as an operator runs it -------------------------------------------


def cli_env(**extra: str) -> dict[str, str]:
    """A `comfyveil` process's environment: none of this run's COMFYVEIL_ settings nor
    its DATABASE_URL, so the configuration file given is all it reads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYVEIL_")}
    env.pop("DATABASE_URL", None)
    return env | extra


def cli_config(tmp_path: Path, database_url: str, comfy: FakeComfyUI) -> Path:
    """A configuration file for the web front end on a free port, this database and GPU."""
    conf = tmp_path / "comfyveil.toml"
    conf.write_text(
        f'data_dir = "{tmp_path}"\n'
        f'[database]\nurl = "{database_url}"\n'
        f'[[backends]]\nname = "gpu0"\nurl = "{comfy.url}"\nvia = "direct"\n'
        "[web]\nport = 0\n"
    )
    return conf


async def cli(conf: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`comfyveil ARGS --config CONF` in a process of its own: its exit status, stdout and
    stderr."""
    proc = await zygote.comfyveil(
        *args,
        "--config",
        str(conf),
        env=cli_env() if env is None else env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def cli_invite(conf: Path, *, env: dict[str, str] | None = None) -> str:
    """What `comfyveil web invite --admin` prints: the link."""
    code, out, err = await cli(conf, "web", "invite", "--admin", env=env)
    assert code == 0, err
    return out.splitlines()[0]


async def spawn(
    conf: Path, *command: str, stderr: int = asyncio.subprocess.PIPE
) -> zygote.Process:
    """`comfyveil COMMAND... --config CONF` in a process of its own, its stdout piped."""
    return await zygote.comfyveil(
        *command,
        "--config",
        str(conf),
        env=cli_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
    )


@contextlib.asynccontextmanager
async def serving(conf: Path) -> AsyncIterator[str]:
    """`comfyveil run` (the web front end, the API and a worker) in a process of its own;
    its URL."""
    proc = await spawn(conf, "run")
    try:
        lines: list[str] = []
        while not any("runs alone" in line for line in lines):
            raw = await asyncio.wait_for(proc.stdout.readline(), 60)  # type: ignore[union-attr]
            assert raw, "stdout closed: " + "".join(lines)
            lines.append(raw.decode())
        found = re.search(r"web front end at (http://127\.0\.0\.1:\d+)", "".join(lines))
        assert found
        yield found.group(1)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
