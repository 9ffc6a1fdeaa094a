"""Helpers shared by the worker and pool tests: queue jobs, run workers, wait for states."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from comfyveil import config, sinks
from comfyveil.comfy import pool, workflow
from comfyveil.store import database, jobs
from comfyveil.worker import Worker, WorkerOptions

FAST = WorkerOptions(
    lease_seconds=3.0,
    poll_interval=0.5,
    shutdown_grace=5.0,
    retry_backoff=0.05,
    recover_interval=0.3,
    delivery_grace=0.5,
    job_timeout=60.0,
    unreachable_wait=2.0,
)


def backend_configs(
    urls: Sequence[str], max_waiting: int = 1, no_trace: bool | str = True
) -> list[config.BackendConfig]:
    return [
        config.BackendConfig(name=f"gpu{i}", url=url, via="direct", max_waiting=max_waiting,
                             no_trace=no_trace)
        for i, url in enumerate(urls)
    ]


async def enqueue(
    db: database.Database, *, command: str = "f", user: int = 1, prompt: str = "a red fox",
    seed: int | None = None, steps: int = 2, **extra: Any,
) -> jobs.Job:
    """Queue one job of a shipped command, validated the way the front end does."""
    await db.commands.seed()
    wf = workflow.find(command)
    values: dict[str, object] = {"prompt": prompt, "steps": steps, **extra}
    if seed is not None:
        values["seed"] = seed
    if command in {"f", "fd", "sd3"}:
        values.setdefault("width", 256)
        values.setdefault("height", 256)
    validated = wf.validate(values)
    return await db.jobs.enqueue(
        jobs.NewJob(user_id=user, chat_id=user, command=wf.command,
                    workflow_hash=wf.hash, params=validated)
    )


async def wait_for(
    check: Callable[[], Awaitable[bool]], timeout: float = 20.0, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


async def never(
    check: Callable[[], Awaitable[bool]], within: float, interval: float = 0.05
) -> None:
    """Fail as soon as `check` comes true within `within` seconds: a "nothing more happens"
    check that waits on the very event proving it wrong, for a stated time."""
    deadline = time.monotonic() + within
    while True:
        if await check():
            raise AssertionError("it happened after all")
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(interval)


async def wait_status(
    db: database.Database, job_id: uuid.UUID, *statuses: jobs.Status, timeout: float = 20.0
) -> jobs.Job:
    found: list[jobs.Job] = []

    async def check() -> bool:
        job = await db.jobs.get(job_id)
        assert job is not None
        found[:] = [job]
        return job.status in statuses

    try:
        await wait_for(check, timeout)
    except AssertionError:
        raise AssertionError(f"job stayed {found[0].status}, wanted {statuses}") from None
    return found[0]


@contextlib.asynccontextmanager
async def running_worker(
    db: database.Database,
    urls: Sequence[str],
    *,
    options: WorkerOptions = FAST,
    delivery: Sequence[sinks.DeliverySink] = (),
    max_waiting: int = 1,
    probe_interval: float = 0.2,
    no_trace: bool | str = True,
) -> AsyncIterator[Worker]:
    """A worker with its own pool, running in a task until the block ends."""
    configs = backend_configs(urls, max_waiting, no_trace)
    async with pool.Pool(configs, probe_interval=probe_interval) as p:
        worker = Worker(db, p, sinks=delivery, options=options)
        task = asyncio.create_task(worker.run(), name="test-worker")
        try:
            yield worker
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)


def sent_values(fake: Any, job_id: uuid.UUID, command: str = "f") -> dict[str, object]:
    """The option values as the GPU got them: read from the graph the fake ComfyUI was
    posted for this job, at every node input each option of the command sets."""
    posted = [p for p in fake.prompts if p["prompt_id"] == str(job_id)]
    assert posted, "the job's graph never reached this ComfyUI"
    graph = posted[-1]["prompt"]
    values: dict[str, object] = {}
    for param in workflow.find(command).params.values():
        found = {repr(graph[t.node]["inputs"][t.input]) for t in param.targets}
        assert len(found) == 1, f"{param.name} differs between its inputs: {found}"
        values[param.name] = graph[param.targets[0].node]["inputs"][param.targets[0].input]
    return values
