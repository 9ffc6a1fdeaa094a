"""The base of the small stores that run each statement on a connection of their own
from the pool (web accounts, API keys, webhooks, the jobs API's reads, previews)."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from comfyveil.store import errors


class PoolStore:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    async def _all(self, query: Any, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every row the statement returns ([] for one that returns none)."""
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            cursor = await conn.execute(query, params)
            return await cursor.fetchall() if cursor.description else []
