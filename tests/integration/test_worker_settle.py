"""A job's final write racing its lease renewal: the result still goes out at once."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from comfyveil import sinks
from comfyveil.store import database, jobs
from tests.integration.worker_support import FAST, enqueue, running_worker, wait_for, wait_status

pytestmark = pytest.mark.timeout(60)

# Renewals every 0.3 s; no re-delivery by the deliver loop within the test.
RACY = dataclasses.replace(FAST, lease_seconds=0.9, delivery_grace=60.0)


async def test_a_renewal_landing_after_completion_does_not_drop_the_delivery(
    db: database.Database, fake_comfy_factory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    fake = await fake_comfy_factory()
    sink = sinks.FileSink(tmp_path / "out")
    real_complete = db.jobs.complete

    async def slow_complete(
        job: jobs.Job, outputs: Sequence[jobs.Output] = (), **claim: Any
    ) -> jobs.Job:
        done = await real_complete(job, outputs, **claim)
        # The row is final now; a renewal tick falls in this gap and finds no lease.
        await asyncio.sleep(RACY.lease_seconds)
        return done

    monkeypatch.setattr(db.jobs, "complete", slow_complete)
    job = await enqueue(db)
    caplog.set_level(logging.WARNING, logger="comfyveil.worker")
    async with running_worker(db, [fake.url], options=RACY, delivery=[sink]):
        await wait_status(db, job.id, jobs.Status.SUCCEEDED)
        await wait_for(_delivered(sink), timeout=5)
        assert await db.jobs.undelivered("files") == []
    assert len(sink.delivered) == 1
    assert not [r for r in caplog.records if getattr(r, "action", "") == "lease_lost"]


def _delivered(sink: sinks.FileSink):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return len(sink.delivered) == 1

    return check
