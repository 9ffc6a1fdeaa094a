"""What `run`, `web` and `worker` share for operating them: the worker's heartbeat, the
metrics listener ([metrics]), and telling systemd when the service is ready or stopping
(Type=notify, WatchdogSec=)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from comfyveil import config, sdnotify
from comfyveil import tasks as background
from comfyveil.metrics import server as metrics_server
from comfyveil.worker import heartbeat as heartbeat_mod


@contextlib.asynccontextmanager
async def operated(
    settings: config.Settings, *, db: Any, pool: Any, worker: Any = None
) -> AsyncIterator[metrics_server.MetricsServer | None]:
    """Run the heartbeat (with a worker), the metrics listener (when enabled) and the
    watchdog for the body's duration; READY=1 once all are up, STOPPING=1 on the way out."""
    tasks: list[asyncio.Task[None]] = []
    listener = None
    try:
        beat = None
        if worker is not None:
            beat = heartbeat_mod.Heartbeat(db, worker, lease_seconds=settings.worker.lease_seconds)
            await beat.beat()  # the row exists before anyone is told we are ready
            tasks.append(beat.start())
        if settings.metrics.enabled:
            listener = metrics_server.MetricsServer(
                settings.metrics.host,
                settings.metrics.port,
                metrics_server.Parts(
                    db=db,
                    pool=pool,
                    heartbeat=beat,
                    lease_seconds=settings.worker.lease_seconds,
                ),
            )
            url = await listener.start()
            print(f"comfyveil: metrics at {url}/metrics", flush=True)
        tasks.append(asyncio.create_task(sdnotify.watchdog(), name="systemd-watchdog"))
        sdnotify.notify("READY=1\nSTATUS=running")
        yield listener
    finally:
        sdnotify.notify("STOPPING=1")
        await background.cancel_and_wait(tasks)
        if listener is not None:
            await listener.close()
