"""Running the named queries of `queries.sql` on a pool or on one connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from comfyveil.store import errors, sql

Row = dict[str, Any]


def _has_rows(cursor: psycopg.AsyncCursor[DictRow]) -> bool:
    # Not cursor.description: it builds a Column object per column on every call, a
    # tenth of a claim's client-side time with the 25 columns of a job row.
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


class Session:
    """Named queries on one connection (inside a transaction when it was opened so)."""

    def __init__(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        self.conn = conn

    async def one(self, query: str, /, **params: Any) -> Row | None:
        """The first row of query `query`, or None."""
        cursor = await self.conn.execute(sql.queries[query], params or None)
        return await cursor.fetchone() if _has_rows(cursor) else None

    async def all(self, query: str, /, **params: Any) -> list[Row]:
        """Every row of query `query`."""
        cursor = await self.conn.execute(sql.queries[query], params or None)
        return await cursor.fetchall() if _has_rows(cursor) else []

    async def run(self, query: str, /, **params: Any) -> int:
        """Run query `query`; the number of rows it touched."""
        cursor = await self.conn.execute(sql.queries[query], params or None)
        return cursor.rowcount


class Connector:
    """Named queries on a connection pool; one method call, one pooled connection."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    @asynccontextmanager
    async def session(self, *, transaction: bool = False) -> AsyncIterator[Session]:
        """A connection from the pool; with transaction=True, all-or-nothing."""
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            if transaction:
                async with conn.transaction():
                    yield Session(conn)
            else:
                yield Session(conn)

    async def one(self, query: str, /, **params: Any) -> Row | None:
        async with self.session() as session:
            return await session.one(query, **params)

    async def all(self, query: str, /, **params: Any) -> list[Row]:
        async with self.session() as session:
            return await session.all(query, **params)

    async def run(self, query: str, /, **params: Any) -> int:
        async with self.session() as session:
            return await session.run(query, **params)
