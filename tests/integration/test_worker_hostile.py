"""A misbehaving backend costs its own job, never the worker (issue 11 §1): the bot's
worker keeps serving other users while one GPU host trickles or floods its answers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyveil.comfy import limits, pool, workflow
from comfyveil.store import database, jobs
from comfyveil.worker import Worker
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.tampering import TamperingComfyUI
from tests.integration.worker_support import FAST, backend_configs, wait_status

pytestmark = pytest.mark.timeout(120)

DEADLINE = 3.0  # the worker's job_timeout
SLACK = 10.0


# Each fake has only the models of one workflow, so the pool sends /f to the first and
# /sd3 to the second: which job meets the misbehaving backend is not left to chance.
FLUX_ONLY = {
    "diffusion_models": ["flux1-schnell.safetensors"],
    "text_encoders": ["clip_l.safetensors", "t5xxl_fp16.safetensors"],
    "vae": ["ae.safetensors"],
}
SD3_ONLY = {"checkpoints": ["sd3.5_large_fp8_scaled.safetensors"]}


async def enqueue(db: database.Database, command: str, user: int) -> jobs.Job:
    """A small job of `user`."""
    await db.commands.seed()
    wf = workflow.find(command)
    values = wf.validate({"prompt": "a fox", "steps": 1, "width": 256, "height": 256})
    return await db.jobs.enqueue(jobs.NewJob(
        user_id=user, chat_id=user, command=command, workflow_hash=wf.hash, params=values,
    ))


@contextlib.asynccontextmanager
async def worker_on(
    db: database.Database, urls: list[str], cap: limits.Limits | None = None
) -> AsyncIterator[Worker]:
    options = dataclasses.replace(FAST, job_timeout=DEADLINE)
    # Files to download: with no trace the images would come over the WebSocket, and the
    # tampered /view these tests are about would never be asked.
    configs = backend_configs(urls, no_trace=False)
    async with pool.Pool(configs, probe_interval=0.2, limits=cap) as backends:
        worker = Worker(db, backends, options=options)
        task = asyncio.create_task(worker.run(), name="test-worker")
        try:
            yield worker
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)


async def test_other_users_are_served_while_a_backend_trickles_its_files(
    db: database.Database, tmp_path: Path
) -> None:
    bad = TamperingComfyUI(
        FLUX_ONLY, root=tmp_path / "bad", trickle_view=True, trickle_interval=10
    )
    good = FakeComfyUI(SD3_ONLY, root=tmp_path / "good")
    await bad.start()
    await good.start()
    try:
        async with worker_on(db, [bad.url, good.url]):
            stuck = await enqueue(db, "f", user=1)
            started = time.monotonic()
            await asyncio.wait_for(bad.misbehaving.wait(), 20)
            other = await enqueue(db, "sd3", user=2)
            served = await wait_status(
                db, other.id, jobs.Status.SUCCEEDED, jobs.Status.FAILED, timeout=DEADLINE + SLACK
            )
            assert served.status is jobs.Status.SUCCEEDED, served.error
            # served while the first job was still being trickled at
            still = await db.jobs.get(stuck.id)
            assert still is not None and still.status is jobs.Status.RUNNING
            failed = await wait_status(db, stuck.id, jobs.Status.FAILED, timeout=DEADLINE + SLACK)
            took = time.monotonic() - started
    finally:
        await bad.stop()
        await good.stop()
    assert failed.error == (
        "backend gpu0 was too slow sending the results; the job was stopped after 3 s"
    )
    assert took < DEADLINE + SLACK
    assert len(await db.jobs.outputs(other.id)) == 1


async def test_an_endless_file_fails_its_job_at_the_configured_cap(
    db: database.Database, tmp_path: Path
) -> None:
    bad = TamperingComfyUI(root=tmp_path / "bad", endless_view=True)
    await bad.start()
    try:
        async with worker_on(db, [bad.url], cap=limits.Limits(max_output_bytes=8 << 20)):
            job = await enqueue(db, "f", user=1)
            failed = await wait_status(db, job.id, jobs.Status.FAILED, timeout=DEADLINE + SLACK)
    finally:
        await bad.stop()
    assert failed.error == "backend gpu0 sent a file larger than 8 MiB"
    assert failed.attempts == 1  # a file too large is not worth another try
    assert bad.view_bytes_sent < (8 + 16) << 20
