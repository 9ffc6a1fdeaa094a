"""A process's presence in the database: a session-level advisory lock on a random 64-bit
key, held on a connection of its own for the process's life. PostgreSQL drops a dead
process's session, and so its lock, as soon as the socket closes (a SIGKILL, a crash, an
OOM kill), so other processes can tell from `pg_locks` that it is gone (`HELD_KEYS`).

The lock is lost with its connection (a database restart, a broken network): it is
taken again at once, trying every `RETRY` seconds until the database answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

import psycopg

from comfyveil import tasks as background
from comfyveil.store import database, errors

logger = logging.getLogger(__name__)

RETRY = 0.2  # seconds between tries to take the lock again (short: see module doc)
KEEPALIVE = 10.0  # seconds between looks at a quiet connection (a half-open one)

# The keys of the bigint advisory locks held now in this database (objsubid 1: the
# bigint form, its high and low 32 bits in classid and objid), as signed bigints.
HELD_KEYS = (
    "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l "
    "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted "
    "  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def new_key() -> int:
    """A random key, positive so it reads the same in every tool (never 0)."""
    return secrets.randbits(63) or 1


class Presence:
    def __init__(self, url: str, *, key: int | None = None) -> None:
        self.url = url
        self.key = new_key() if key is None else key
        self.held = asyncio.Event()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Take the lock (once, now, if the database answers; else in the background)
        and keep it."""
        if self._task is not None:
            return
        try:
            await self._take()
        except errors.StoreError as exc:
            self._lost(exc)
        self._task = asyncio.create_task(self._hold(), name="presence")

    async def close(self) -> None:
        """Let the lock go, at once (the server ends a closed session a moment later)."""
        if self._task is not None:
            await background.cancel_and_wait([self._task])
            self._task = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.execute("SELECT pg_advisory_unlock_all()")
        await self._drop()

    async def _take(self) -> None:
        conn = await database.connect(self.url)
        try:
            async with errors.wrap_exceptions():
                # Blocks while an older session of ours still holds it (a connection the
                # server has not yet seen die): meanwhile that session vouches for us.
                await conn.execute("SELECT pg_advisory_lock(%(k)s)", {"k": self.key})
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self.held.set()

    async def _drop(self) -> None:
        self.held.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    def _lost(self, exc: BaseException) -> None:
        logger.warning(
            "this process's presence lock is not held; taking it again: %s",
            type(exc).__name__,
            extra={"action": "presence_lost"},
        )

    async def _hold(self) -> None:
        while True:
            conn = self._conn
            if conn is None:
                try:
                    await self._take()
                except Exception:  # unreachable still: the next try comes soon
                    await asyncio.sleep(RETRY)
                    continue
                logger.info("presence lock taken again", extra={"action": "presence_taken"})
                continue
            try:
                # Waiting on the socket sees the server close it at once; the keepalive
                # finds a connection whose other end vanished without a word.
                async for _ in conn.notifies(timeout=KEEPALIVE):
                    pass
                await conn.execute("SELECT 1")
            except (psycopg.Error, OSError) as exc:
                self._lost(exc)
                await self._drop()
