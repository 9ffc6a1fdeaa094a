"""A worker's heartbeat: its row in `worker_heartbeats`, rewritten every third of the
lease (as its leases are renewed), deleted on a clean stop.

Started beside the worker by the command that runs it (`comfyveil run`, `comfyveil
worker`), so the worker's loop knows nothing of it. `last_success` (monotonic) feeds the
metrics listener's /readyz: a worker whose writes stopped landing is not ready, even
while its process lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
import time
from typing import Any

from comfyveil import __version__
from comfyveil.store import errors as store_errors

logger = logging.getLogger(__name__)


class Heartbeat:
    """Writes `worker`'s heartbeat until the task running `run()` is cancelled."""

    def __init__(self, db: Any, worker: Any, *, lease_seconds: float) -> None:
        self.db = db
        self.worker = worker
        self.interval = max(lease_seconds / 3, 0.05)
        self.started_at = dt.datetime.now(dt.UTC)
        self.host = socket.gethostname()
        self.last_success = time.monotonic()  # counts as fresh until the first write fails
        self.beats = 0

    async def beat(self) -> bool:
        """Write the row once; False when the database could not take it."""
        try:
            await self.db.heartbeats.beat(
                self.worker.worker_id,
                host=self.host,
                version=__version__,
                started_at=self.started_at,
                jobs_running=len(self.worker.running_jobs),
            )
        except store_errors.StoreError as exc:
            logger.info("cannot write the heartbeat: %s", exc, extra={"action": "heartbeat_failed"})
            return False
        self.last_success = time.monotonic()
        self.beats += 1
        if self.beats % 1000 == 1:  # now and then, not every beat
            with contextlib.suppress(store_errors.StoreError):
                await self.db.heartbeats.forget_old()
        return True

    async def run(self) -> None:
        try:
            while True:
                await self.beat()
                await asyncio.sleep(self.interval)
        finally:
            # A clean stop says so at once; a killed worker's row ages into "gone".
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self.db.heartbeats.stop(self.worker.worker_id)

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.run(), name=f"{self.worker.worker_id}-heartbeat")
