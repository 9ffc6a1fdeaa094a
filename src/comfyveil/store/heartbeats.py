"""Worker heartbeats: which workers are alive, seen from any process that reaches the
database (`comfyveil status`, the metrics, /backends, the admin's backends page)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from comfyveil.store.connector import Connector

MAX_SHOWN = 200  # rows read at a time: a status table, not an archive


@dataclass(frozen=True)
class Heartbeat:
    worker_id: str
    host: str
    version: str
    started_at: dt.datetime
    last_seen: dt.datetime
    jobs_running: int
    alive: bool  # spoke within the lease; False: gone (died, or cut off from the database)


class HeartbeatStore:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.db = Connector(pool)

    async def beat(
        self,
        worker_id: str,
        *,
        host: str,
        version: str,
        started_at: dt.datetime,
        jobs_running: int,
    ) -> None:
        await self.db.run(
            "beat",
            worker_id=worker_id[:200],
            host=host[:255],
            version=version[:64],
            started_at=started_at,
            jobs_running=jobs_running,
        )

    async def stop(self, worker_id: str) -> None:
        await self.db.run("stop_beating", worker_id=worker_id[:200])

    async def forget_old(self) -> int:
        return await self.db.run("forget_heartbeats")

    async def all(self, lease_seconds: float, *, limit: int = MAX_SHOWN) -> list[Heartbeat]:
        rows = await self.db.all("heartbeats", lease_seconds=lease_seconds, limit=limit)
        return [Heartbeat(**row) for row in rows]

    async def alive(self, lease_seconds: float) -> int:
        row = await self.db.one("workers_alive", lease_seconds=lease_seconds)
        return int(row["alive"]) if row else 0

    async def scrape_counts(self, lease_seconds: float) -> dict[str, int]:
        """Jobs queued and running, and workers alive: one round trip for a scrape."""
        row = await self.db.one("scrape_counts", lease_seconds=lease_seconds)
        return {key: int(value) for key, value in row.items()} if row else {}

    async def queue_counts(self) -> dict[str, int]:
        """Jobs queued and running now (all workers together)."""
        row = await self.db.one("queue_counts")
        return {"queued": int(row["queued"]), "running": int(row["running"])} if row else {}
