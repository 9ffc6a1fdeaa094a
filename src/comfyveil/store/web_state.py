"""Web state that every web/API process over one database shares (migration 0018): the
secrets behind derived tokens (logged-out forms' CSRF tokens, signed result links) and
the site's failed logins. Nothing that decides a request lives in one process's memory,
so any number of processes can answer one site."""

from __future__ import annotations

import secrets
from typing import Any

from psycopg_pool import AsyncConnectionPool

from comfyveil.store import errors

SECRET_BYTES = 32


class WebState:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    async def _one(self, query: Any, params: dict[str, Any] | None = None) -> dict[str, Any]:
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            cursor = await conn.execute(query, params)
            row = await cursor.fetchone() if cursor.description else None
        return row or {}

    async def secret(self, name: str) -> bytes:
        """The site's secret `name`, made by whichever process asks first."""
        for _ in range(2):  # empty only when another process made it at the same moment
            row = await self._one(
                "WITH made AS (INSERT INTO web_secrets (name, secret) VALUES (%(n)s, %(s)s) "
                "ON CONFLICT (name) DO NOTHING RETURNING secret) "
                "SELECT secret FROM made UNION ALL "
                "SELECT secret FROM web_secrets WHERE name = %(n)s LIMIT 1",
                {"n": name, "s": secrets.token_bytes(SECRET_BYTES)},
            )
            if row:
                return bytes(row["secret"])
        raise errors.StoreError("the site's secret could not be read")

    async def login_failed(self, window: float) -> None:
        """Count one failed login (and drop those older than the window)."""
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            await conn.execute("INSERT INTO web_login_failures DEFAULT VALUES")
            await conn.execute(
                "DELETE FROM web_login_failures WHERE at < now() - make_interval(secs => %s)",
                (window,),
            )

    async def login_failures(self, window: float) -> tuple[int, float]:
        """Failed logins of the last `window` seconds, and the age in seconds of the
        oldest of them (0 when none)."""
        row = await self._one(
            "SELECT count(*) AS n, "
            "coalesce(extract(epoch FROM now() - min(at)), 0)::float8 AS age "
            "FROM web_login_failures WHERE at >= now() - make_interval(secs => %(w)s)",
            {"w": window},
        )
        return int(row["n"]), float(row["age"])
