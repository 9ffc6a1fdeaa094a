"""Opening the database: the URL or an embedded server, migrations, the pool, LISTEN.

    async with await Database.open(settings) as db:
        job = await db.jobs.enqueue(...)

`Database.open` connects to `settings.database.url` (DATABASE_URL is already folded in
by comfyveil.config) or starts the embedded PostgreSQL in `settings.database_dir`,
applies pending migrations, and opens a connection pool. `close()` closes the pool and
stops the embedded server when this process started it and nothing else uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from comfyveil import config, config_load
from comfyveil.store import (
    commands,
    embedded,
    errors,
    heartbeats,
    job_store,
    model_lists,
    refusals,
    sessions,
    sql,
    traces,
    users,
)
from comfyveil.store.connector import Session

logger = logging.getLogger(__name__)

JOBS_CHANNEL = "comfyveil_jobs"  # a job became claimable: {"job_id"}
UPDATES_CHANNEL = "comfyveil_job_updates"  # a job changed: {"job_id", "event", "status"}
COMMANDS_CHANNEL = "comfyveil_commands"  # a command was added, removed, switched on or off
CONNECT_TIMEOUT = 10  # seconds
KEEPALIVE_SECONDS = 30.0
RECONNECT_DELAY = 0.5  # seconds, doubled up to RECONNECT_DELAY_MAX
RECONNECT_DELAY_MAX = 10.0


async def connect(url: str, *, autocommit: bool = True) -> psycopg.AsyncConnection[DictRow]:
    """One connection outside the pool.

    Raises:
        DatabaseUnreachable: in plain words, why not.
    """
    async with errors.wrap_exceptions():
        return await psycopg.AsyncConnection.connect(
            url, autocommit=autocommit, row_factory=dict_row, connect_timeout=CONNECT_TIMEOUT
        )


# -- migrations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MigrationStatus:
    applied: tuple[tuple[str, str, dt.datetime], ...]  # (version, name, applied_at)
    pending: tuple[tuple[str, str], ...]  # (version, name)

    @property
    def current(self) -> str | None:
        return self.applied[-1][0] if self.applied else None

    @property
    def newest(self) -> str | None:
        """The newest version this code knows."""
        known = [v for v, _ in self.pending] + [v for v, _, _ in self.applied]
        return max(known) if known else None


async def migration_status(conn: psycopg.AsyncConnection[DictRow]) -> MigrationStatus:
    """Which migrations the database has and which this code would still apply."""
    async with errors.wrap_exceptions():
        session = Session(conn)
        present = await session.one("migrations_table_exists")
        rows = await session.all("applied_migrations") if present and present["present"] else []
    applied = tuple((r["version"], r["name"], r["applied_at"]) for r in rows)
    done = {version for version, _, _ in applied}
    pending = tuple((v, n) for v, n, _ in sql.migrations() if v not in done)
    return MigrationStatus(applied=applied, pending=pending)


async def migrate(conn: psycopg.AsyncConnection[DictRow]) -> list[str]:
    """Apply pending migrations in order, in one transaction; the versions applied.

    An advisory lock makes processes that start together take turns: the first migrates,
    the others then find nothing to do.

    Raises:
        MigrationError: a migration failed (nothing was changed), or the database was
            migrated by a newer comfyveil.
    """
    known = sql.migrations()
    applied_now: list[str] = []
    try:
        async with conn.transaction():
            session = Session(conn)
            await session.one("lock_migrations")
            await session.run("create_migrations_table")
            done = {r["version"] for r in await session.all("applied_migrations")}
            unknown = done - {version for version, _, _ in known}
            if unknown:
                raise errors.MigrationError(
                    f"the database has schema version {max(unknown)}, newer than this "
                    "comfyveil knows; upgrade comfyveil"
                )
            for version, name, text in known:
                if version in done:
                    continue
                try:
                    await conn.execute(text)
                except psycopg.Error as exc:
                    primary = exc.diag.message_primary if exc.diag else str(exc)
                    raise errors.MigrationError(
                        f"migration {version}_{name} failed: {primary}"
                    ) from exc
                await session.run("record_migration", version=version, name=name)
                applied_now.append(version)
    except (psycopg.Error, OSError) as exc:
        raise errors.translate(exc) from exc
    for version in applied_now:
        logger.info("migration applied", extra={"action": "migrated", "version": version})
    return applied_now


# -- LISTEN --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Notification:
    channel: str
    payload: dict[str, Any]
    # True for the marker yielded after a reconnect: notifications may have been missed,
    # so look at the table again.
    reconnected: bool = False


def _parse(channel: str, payload: str) -> Notification:
    try:
        data = json.loads(payload) if payload else {}
    except ValueError:
        data = {"raw": payload}
    return Notification(channel=channel, payload=data if isinstance(data, dict) else {})


class Listener:
    """LISTEN on its own autocommit connection; iterate it for notifications.

    Entering the context subscribes, so nothing sent after `__aenter__` returns is
    missed. Iteration runs a keepalive query when the connection is quiet and reconnects
    (with growing delays) when it breaks, yielding a `reconnected` marker each time.
    """

    def __init__(
        self, url: str, channels: Iterable[str], *, keepalive: float = KEEPALIVE_SECONDS
    ) -> None:
        self.url = url
        self.channels = tuple(channels)
        self.keepalive = keepalive
        self._conn: psycopg.AsyncConnection[DictRow] | None = None

    async def _connect(self) -> None:
        conn = await connect(self.url)
        try:
            async with errors.wrap_exceptions():
                for channel in self.channels:
                    await conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def __aenter__(self) -> Self:
        await self._connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._drop()

    def __aiter__(self) -> AsyncIterator[Notification]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Notification]:
        delay = RECONNECT_DELAY
        while True:
            if self._conn is None:
                try:
                    await self._connect()
                except errors.StoreError as exc:
                    logger.warning("LISTEN reconnect failed: %s", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RECONNECT_DELAY_MAX)
                    continue
                delay = RECONNECT_DELAY
                yield Notification(channel="", payload={}, reconnected=True)
            conn = self._conn
            assert conn is not None
            try:
                async for notify in conn.notifies(timeout=self.keepalive):
                    yield _parse(notify.channel, notify.payload)
                await conn.execute("SELECT 1")  # keepalive: finds a dead connection early
            except psycopg.Error as exc:
                logger.warning("LISTEN connection lost; reconnecting: %s", errors.translate(exc))
                await self._drop()


# -- the database ----------------------------------------------------------------------


class Database:
    """The opened store: a pool plus one object per table family."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        url: str,
        server: embedded.EmbeddedServer | None = None,
    ) -> None:
        self.pool = pool
        self.url = url
        self._server = server
        self._closed = False
        self.jobs = job_store.JobStore(pool)
        self.users = users.UserStore(pool)
        self.sessions = sessions.SessionStore(pool)
        self.commands = commands.CommandStore(pool)
        self.traces = traces.TraceStore(pool)
        self.refusals = refusals.RefusalStore(pool)
        self.heartbeats = heartbeats.HeartbeatStore(pool)
        self.model_lists = model_lists.ModelListStore(pool)

    @staticmethod
    async def resolve_url(
        settings: config.Settings,
    ) -> tuple[str, embedded.EmbeddedServer | None]:
        """The configured URL, or a started embedded server's URL (and the server)."""
        if settings.database.url:
            return settings.database.url, None
        server = embedded.EmbeddedServer(settings.database_dir)
        return await server.start(), server

    @classmethod
    async def open(
        cls,
        settings: config.Settings | None = None,
        *,
        url: str | None = None,
        run_migrations: bool = True,
        min_size: int = 1,
        max_size: int = 10,
    ) -> Database:
        """Connect (or start the embedded server), migrate, open the pool.

        Raises:
            DatabaseUnreachable, EmbeddedServerError, MigrationError.
        """
        server = None
        if url is None:
            url, server = await cls.resolve_url(settings or config_load.load())
        try:
            conn = await connect(url)
            try:
                if run_migrations:
                    await migrate(conn)
            finally:
                await conn.close()
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                url, min_size=min_size, max_size=max_size, open=False, name="comfyveil",
                kwargs={"autocommit": True, "row_factory": dict_row},
                timeout=CONNECT_TIMEOUT,
            )
            async with errors.wrap_exceptions():
                await pool.open(wait=True, timeout=CONNECT_TIMEOUT)
        except BaseException:
            if server is not None:
                await server.stop()
            raise
        return cls(pool, url, server)

    async def close(self) -> None:
        """Close the pool and release the embedded server. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.pool.close()
        finally:
            if self._server is not None:
                await self._server.stop()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def listen(
        self, channels: Iterable[str] = (JOBS_CHANNEL, UPDATES_CHANNEL), *,
        keepalive: float = KEEPALIVE_SECONDS,
    ) -> Listener:
        """A Listener on its own connection: `async with db.listen() as l: async for n in l`."""
        return Listener(self.url, channels, keepalive=keepalive)

    async def migration_status(self) -> MigrationStatus:
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            return await migration_status(conn)
