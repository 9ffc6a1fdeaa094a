"""Keeping data only as long as configured: finished jobs (their prompts, input images,
outputs and events) are deleted `[privacy] job_retention_days` after they end; what jobs
left on GPU hosts (`store.traces`) is removed from there once they run nowhere any more.

Every `comfyveil run` and `comfyveil worker` runs the purge; it is one idempotent
DELETE, so several processes doing it at once is harmless, and so is removing a trace
twice (an overwrite, a history delete of an unknown id).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Sequence

from comfyveil import config
from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import notrace
from comfyveil.comfy import pool as pool_mod
from comfyveil.store import compaction, database
from comfyveil.store import errors as store_errors
from comfyveil.store.traces import StoredTrace

logger = logging.getLogger(__name__)

PURGE_INTERVAL = 3600.0  # seconds between two purges
SWEEP_INTERVAL = 60.0  # seconds between two sweeps of the backends for settled traces
SWEEP_WAIT = 5.0  # seconds a prompt still on its GPU may take to end before it is left for later


async def purge_once(
    db: database.Database, privacy: config.PrivacyConfig, backends: pool_mod.Pool | None = None
) -> int:
    """Delete what is past retention now, and sweep the backends; the number of jobs
    deleted."""
    purged, left = await db.jobs.purge(dt.timedelta(days=privacy.job_retention_days))
    if purged:
        logger.info("purged %d finished jobs past retention", purged,
                    extra={"action": "jobs_purged", "count": purged})
    if compaction.worth_it(purged, left):
        # Most of the job tables just went: hand their room back rather than keep it at
        # its peak for good (what this process purged, no other did: one compaction).
        try:
            await compaction.compact(db.pool)
        except store_errors.StoreError as exc:
            logger.info("job tables not compacted: %s", exc,
                        extra={"action": "compaction_failed"})
    if backends is not None:
        await sweep(db, backends, await db.traces.settled())
    return purged


async def sweep(
    db: database.Database,
    backends: pool_mod.Pool,
    traces: Sequence[StoredTrace],
    *,
    stop_running: bool = False,
) -> int:
    """Remove `traces` from their backends, one job at a time; the number removed.

    With `stop_running` (a user who asked to be forgotten) a prompt still queued or running
    is stopped first. A backend that is unknown here or cannot be reached keeps its traces
    written down for the next sweep.
    """
    jobs: dict[tuple[str, str], list[notrace.Trace]] = {}
    for stored in traces:
        jobs.setdefault((stored.backend, str(stored.job_id)), []).append(stored.trace)
    removed = 0
    for (name, job_id), found in jobs.items():
        backend = backends.get(name)
        if backend is None:
            continue
        client = backend.client
        prompt_id = job_id if any(t.kind == "history" for t in found) else None
        files = [t for t in found if t.kind != "history"]
        try:
            if stop_running and prompt_id is not None:
                await client.cancel(prompt_id)
            gone = await notrace.scrub(client, prompt_id, files, wait=SWEEP_WAIT)
        except comfy_errors.ComfyError as exc:
            logger.info("could not clean backend %s: %s", name, exc,
                        extra={"action": "sweep_failed"})
            continue
        await db.traces.drop(name, gone)
        removed += len(gone)
    if removed:
        logger.info("removed %d traces of jobs from backends", removed,
                    extra={"action": "backends_swept", "count": removed})
    return removed


async def forget_on_backends(
    db: database.Database, backends: pool_mod.Pool | None, user_id: int
) -> list[StoredTrace]:
    """Unlink a user's traces from them and return them for `sweep`; call before the
    user's jobs are deleted (which ends the link through them too)."""
    found = await db.traces.settled(user_id=user_id)
    await db.traces.disown(user_id)
    return found if backends is not None else []


async def purge_forever(
    db: database.Database,
    privacy: config.PrivacyConfig,
    *,
    interval: float = PURGE_INTERVAL,
    backends: pool_mod.Pool | None = None,
    sweep_interval: float = SWEEP_INTERVAL,
) -> None:
    """Purge at start, then every `interval` seconds, until cancelled; between purges,
    sweep the backends every `sweep_interval` seconds. A job whose retry ran on another
    backend, or whose clean-up failed there, left traces that only a sweep removes: they
    go within about `sweep_interval` of the job's end, not at the next purge."""
    next_purge = 0.0
    while True:
        try:
            if time.monotonic() >= next_purge:
                await purge_once(db, privacy, backends)
                next_purge = time.monotonic() + interval
            elif backends is not None:
                await sweep(db, backends, await db.traces.settled())
        except store_errors.StoreError as exc:  # the database is down: try again later
            logger.warning("could not purge old jobs: %s", exc,
                           extra={"action": "purge_failed"})
        await asyncio.sleep(interval if backends is None else min(interval, sweep_interval))
