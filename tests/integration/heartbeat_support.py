"""Writing worker heartbeats in tests, as `comfyveil run` and `comfyveil worker` do."""

from __future__ import annotations

from types import SimpleNamespace

from comfyveil.store import database
from comfyveil.worker.heartbeat import Heartbeat


async def beating(
    db: database.Database, worker_id: str, *, running: int = 0, gone: bool = False
) -> None:
    """A worker's heartbeat row; `gone`: it has been quiet for an hour."""
    worker = SimpleNamespace(worker_id=worker_id, running_jobs=[None] * running)
    await Heartbeat(db, worker, lease_seconds=30).beat()
    if gone:
        async with db.pool.connection() as conn:
            await conn.execute(
                "UPDATE worker_heartbeats SET last_seen = now() - interval '1 hour' "
                "WHERE worker_id = %s",
                (worker_id,),
            )
