"""Keeping data only as long as configured: finished jobs (their prompts, input images,
outputs and events) are deleted `[privacy] job_retention_days` after they end.

Every `comfyveil run` and `comfyveil worker` runs the purge; it is one idempotent
DELETE, so several processes doing it at once is harmless.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from comfyveil import config
from comfyveil.store import database
from comfyveil.store import errors as store_errors

logger = logging.getLogger(__name__)

PURGE_INTERVAL = 3600.0  # seconds between two purges


async def purge_once(db: database.Database, privacy: config.PrivacyConfig) -> int:
    """Delete what is past retention now; the number of jobs deleted."""
    purged = await db.jobs.purge_expired(dt.timedelta(days=privacy.job_retention_days))
    if purged:
        logger.info("purged %d finished jobs past retention", purged,
                    extra={"action": "jobs_purged", "count": purged})
    return purged


async def purge_forever(
    db: database.Database, privacy: config.PrivacyConfig, *, interval: float = PURGE_INTERVAL
) -> None:
    """Purge at start, then every `interval` seconds, until cancelled."""
    while True:
        try:
            await purge_once(db, privacy)
        except store_errors.StoreError as exc:  # the database is down: try again later
            logger.warning("could not purge old jobs: %s", exc,
                           extra={"action": "purge_failed"})
        await asyncio.sleep(interval)
