"""The worker against real PostgreSQL and fake ComfyUI backends."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import time
from pathlib import Path

import pytest
from PIL import Image

from comfyveil import config, sinks
from comfyveil.comfy import pool, workflow
from comfyveil.store import database, jobs
from comfyveil.worker import Worker
from tests.integration.worker_support import (
    FAST,
    enqueue,
    never,
    running_worker,
    sent_values,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.timeout(120)


async def test_a_job_runs_once_and_its_files_are_delivered(
    db: database.Database, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory()
    sink = sinks.FileSink(tmp_path / "out")
    job = await enqueue(db)
    async with running_worker(db, [fake.url], delivery=[sink]):
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED)
        await wait_for(lambda: _true(len(sink.delivered) == 1))
    assert done.backend == "gpu0" and done.attempts == 1 and done.submitted
    assert fake.executions[str(job.id)] == 1
    outputs = await db.jobs.outputs(job.id)
    assert len(outputs) == 1 and outputs[0].data.startswith(b"\x89PNG")
    assert sink.delivered[0].read_bytes() == outputs[0].data
    assert await db.jobs.undelivered("files") == []


async def test_the_gpu_gets_the_values_the_user_asked_for(
    db: database.Database, fake_comfy_factory
) -> None:
    """What reaches ComfyUI is the job's values, not the workflow's defaults or a fresh seed
    (none of these is the default of /f)."""
    fake = await fake_comfy_factory()
    job = await enqueue(db, prompt="a blue heron at dawn", seed=987_654_321, steps=3,
                        width=320, height=448)
    async with running_worker(db, [fake.url]):
        await wait_status(db, job.id, jobs.Status.SUCCEEDED)
    assert sent_values(fake, job.id) == {
        "prompt": "a blue heron at dawn", "seed": 987_654_321, "steps": 3,
        "width": 320, "height": 448,
    }
    output = (await db.jobs.outputs(job.id))[0].data
    with Image.open(io.BytesIO(output)) as image:
        assert image.size == (320, 448)  # the fake draws at the size it was given


async def test_a_job_longer_than_its_lease_keeps_it_and_runs_once(
    db: database.Database, fake_comfy_factory
) -> None:
    """The lease is renewed while the job runs: a second worker, looking for expired
    leases all along, never takes it over. (Steps slower than the lease: the progress
    writes, which extend the lease too, cannot keep it alone.)"""
    fake = await fake_comfy_factory(step_delay=2.5)
    short = dataclasses.replace(FAST, lease_seconds=1.5, recover_interval=0.2)
    job = await enqueue(db, steps=2)  # about 5 s: more than three leases
    async with running_worker(db, [fake.url], options=short), \
            running_worker(db, [fake.url], options=short):
        started = time.monotonic()
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
    assert time.monotonic() - started > 2 * short.lease_seconds
    kinds = [e.kind for e in await db.jobs.events(job.id)]
    assert kinds.count("claimed") == 1 and "lease_expired" not in kinds, kinds
    assert done.attempts == 1 and fake.executions[str(job.id)] == 1


async def test_a_job_that_kills_its_worker_every_time_ends_failed(
    db: database.Database, fake_comfy_factory
) -> None:
    """A poison job: each worker that takes it dies (no renewal, no final write). After
    max_attempts the recovering worker fails it with a plain sentence instead of
    queueing it for ever."""
    fake = await fake_comfy_factory()
    await db.commands.seed()
    wf = workflow.find("f")
    values = wf.validate({"prompt": "a fox", "steps": 2, "width": 256, "height": 256})
    poison = await db.jobs.enqueue(jobs.NewJob(
        user_id=1, chat_id=1, command="f", workflow_hash=wf.hash, params=values,
        backends=("doomed",), max_attempts=3,  # only the dying workers may take it
    ))
    async with running_worker(db, [fake.url]):  # gpu0: recovers leases, never claims it
        for attempt in range(1, 4):
            claimed = await db.jobs.claim(f"dies-{attempt}", backends=["doomed"],
                                          lease_seconds=0.3)
            assert claimed is not None and claimed.id == poison.id
            assert claimed.attempts == attempt
            expected = jobs.Status.FAILED if attempt == 3 else jobs.Status.QUEUED
            ended = await wait_status(db, poison.id, expected, timeout=10)
    assert ended.error == "the job was interrupted too many times"
    assert ended.attempts == 3 and ended.finished_at is not None
    assert await db.jobs.claim("dies-4", backends=["doomed"]) is None
    assert not fake.prompts


async def test_jobs_queued_one_after_another_start_on_their_notification(
    db: database.Database, fake_comfy_factory
) -> None:
    """After a claim found the queue empty the worker claims only as many jobs as were
    announced; each announced job must still start at once, not at the next poll."""
    fake = await fake_comfy_factory()
    slow_poll = dataclasses.replace(FAST, poll_interval=30.0)
    async with running_worker(db, [fake.url], options=slow_poll):
        for round_ in range(3):
            batch = [await enqueue(db, user=round_ * 10 + i, prompt=f"fox {i}")
                     for i in range(round_ + 1)]
            for job in batch:
                await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=10)
            await asyncio.sleep(0.3)  # the worker finds the queue empty in between


async def test_the_gpu_takes_the_next_job_while_a_result_is_still_downloading(
    db: database.Database, fake_comfy_factory
) -> None:
    """A backend's slot is free once its GPU is done, not once the files are home: over
    a slow link the next job must not wait for the previous download."""
    fake = await fake_comfy_factory(step_delay=0.1)
    fake.view_gate = asyncio.Event()  # downloads wait until the second job has run
    first = await enqueue(db, prompt="first")
    second = await enqueue(db, prompt="second")
    # Files to download (not images over the WebSocket), one job at a time.
    async with running_worker(db, [fake.url], max_waiting=0, no_trace=False):
        await wait_for(lambda: _true(fake.executions[str(first.id)] == 1), timeout=10)
        await wait_for(lambda: _true(str(second.id) in fake.history_entries), timeout=20)
        assert (await db.jobs.get(first.id)).status is jobs.Status.RUNNING  # still downloading
        fake.view_gate.set()
        for job in (first, second):
            await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=10)


async def test_a_gpu_restarted_before_its_result_was_fetched_runs_the_prompt_once_more(
    db: database.Database, fake_comfy_factory
) -> None:
    """With the defaults (no trace): a result still downloading when its GPU crashes is
    gone with the server's temp folder and history, so the prompt runs there once more
    and the user still gets one result (the chaos hour's nine "double runs")."""
    fake = await fake_comfy_factory(step_delay=0.05)
    fake.view_gate = asyncio.Event()  # the download hangs, as over a stalled circuit
    job = await enqueue(db, prompt="a heron")
    async with running_worker(db, [fake.url]):
        await wait_for(lambda: _true(str(job.id) in fake.history_entries), timeout=20)
        assert (await db.jobs.get(job.id)).status is jobs.Status.RUNNING
        await fake.restart()  # empty temp/, history and queue, as ComfyUI comes back
        fake.view_gate.set()
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
    assert fake.executions[str(job.id)] == 2
    assert len(await db.jobs.outputs(job.id)) == 1 and done.error is None
    assert str(job.id) not in fake.history_entries  # struck out once the result was home


async def _true(value: bool) -> bool:
    return value


async def test_progress_is_recorded_while_running(
    db: database.Database, fake_comfy_factory
) -> None:
    fake = await fake_comfy_factory(step_delay=0.15)
    job = await enqueue(db, steps=6)
    seen: list[dict] = []

    async def progressing() -> bool:
        current = await db.jobs.get(job.id)
        assert current is not None
        if current.progress:
            seen.append(current.progress)
        return any(p.get("percent") for p in seen)

    async with running_worker(db, [fake.url]):
        await wait_for(progressing, timeout=10, interval=0.03)
        await wait_status(db, job.id, jobs.Status.SUCCEEDED)
    steps = [p for p in seen if p.get("percent") is not None]
    assert steps[0]["backend"] == "gpu0" and steps[0]["max"] == 6
    assert 0 <= steps[0]["percent"] <= 100


async def test_a_run_with_two_samplers_counts_its_steps_across_both(
    db: database.Database, fake_comfy_factory
) -> None:
    """Wan 2.2 runs its steps in two samplers (high noise for 2, low noise for the rest),
    each counting its own. The progress users see and the ETA weighs is one count across
    both: 8 steps, never back to 0 halfway (it said 2/2, "done", then 0/6)."""
    # 0.4 s a step: the first write (step 1 or 2) stands for about a second before step 3
    # is written; at 0.12 s a loaded machine's poll saw none of it ([4, 4, 4, ...]).
    fake = await fake_comfy_factory(step_delay=0.4)
    job = await enqueue(db, command="wan", steps=8, width=256, height=256, length=5)
    seen: list[dict] = []

    async def finished() -> bool:
        current = await db.jobs.get(job.id)
        assert current is not None
        if current.progress and current.progress.get("max") is not None:
            seen.append(current.progress)
        return current.status is jobs.Status.SUCCEEDED

    async with running_worker(db, [fake.url]):
        await wait_for(finished, timeout=30, interval=0.03)
    assert {p["max"] for p in seen} == {8}, seen
    done = [p["value"] for p in seen]  # progress is written twice a second at most
    assert done == sorted(done), done
    assert any(v <= 2 for v in done) and any(v > 2 for v in done), done
    assert len({p["node"] for p in seen}) == 2  # both samplers reported


async def test_cancel_queued_and_running_jobs(
    db: database.Database, fake_comfy_factory
) -> None:
    fake = await fake_comfy_factory(step_delay=1.0)
    # A step of 1 s: the prompt still runs on the GPU when the worker hears that its job
    # was cancelled, which must not make it interrupt the prompt a second time.
    running_job = await enqueue(db, steps=8, prompt="first")
    async with running_worker(db, [fake.url], max_waiting=0):
        await wait_for(lambda: _true(fake.running is not None), timeout=10)
        queued_job = await enqueue(db, steps=1, prompt="second")
        cancelled = await db.jobs.cancel(queued_job.id)
        assert cancelled is not None and cancelled.status is jobs.Status.CANCELLED
        await db.jobs.cancel(running_job.id)
        done = await wait_status(db, running_job.id, jobs.Status.CANCELLED, timeout=10)
        # The worker still listens while the GPU finishes the step it was in, and then
        # removes the interrupted prompt's history entry (no trace).
        await wait_for(lambda: _true(fake.running is None), timeout=5)
        await wait_for(lambda: _true(not fake.history_entries), timeout=10)
    assert done.error is None
    # Only that prompt was interrupted, once, and the queued one never reached the GPU.
    assert fake.interrupts == [{"prompt_id": str(running_job.id)}]
    assert fake.executions[str(queued_job.id)] == 0


async def test_three_workers_run_thirty_jobs_exactly_once(
    db: database.Database, fake_comfy_factory
) -> None:
    fakes = [await fake_comfy_factory(step_delay=0.01) for _ in range(4)]
    urls = [f.url for f in fakes]
    queued = [await enqueue(db, user=1 + i % 3, prompt=f"job {i}", seed=i) for i in range(30)]
    # Healthy workers sharing a queue, not lease takeover (tested above): FAST's 3 s lease
    # can lapse while a busy machine starves a worker, and the job then rightly runs again.
    steady = dataclasses.replace(FAST, lease_seconds=30.0)
    async with (
        running_worker(db, urls, options=steady),
        running_worker(db, urls, options=steady),
        running_worker(db, urls, options=steady),
    ):
        for job in queued:
            await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=60)
    ran = sum((f.executions for f in fakes), start=type(fakes[0].executions)())
    assert {str(j.id) for j in queued} == set(ran)
    assert all(count == 1 for count in ran.values())
    for job in queued:
        events = [e.kind for e in await db.jobs.events(job.id)]
        assert events.count("claimed") == 1, events
    assert sum(1 for f in fakes if f.executions) >= 2  # the work was spread over GPUs


async def test_a_backend_killed_mid_job_the_job_finishes_on_another(
    db: database.Database, fake_comfy_factory
) -> None:
    first = await fake_comfy_factory(step_delay=0.2)
    second = await fake_comfy_factory(step_delay=0.01)
    job = await enqueue(db, steps=8)
    # Only gpu0 is up at first, so the job surely starts there.
    async with running_worker(db, [first.url, second.url]) as worker:
        await wait_for(lambda: _true(first.running is not None), timeout=10)
        await first.kill()
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
        assert worker.pool.get("gpu0").healthy is False
    assert done.backend == "gpu1" and done.attempts == 2
    assert second.executions[str(job.id)] == 1
    kinds = [e.kind for e in await db.jobs.events(job.id)]
    assert "retry_scheduled" in kinds


async def test_a_missing_model_fails_at_once_with_a_plain_message(
    db: database.Database, fake_comfy_factory
) -> None:
    fake = await fake_comfy_factory(models={"checkpoints": [], "diffusion_models": [],
                                            "text_encoders": [], "vae": []})
    job = await enqueue(db)
    async with running_worker(db, [fake.url]):
        failed = await wait_status(db, job.id, jobs.Status.FAILED, timeout=10)
    assert failed.error is not None
    assert failed.error.startswith("no GPU has the model file flux1-schnell")
    assert failed.attempts == 1 and not fake.executions


async def test_all_backends_down_the_job_waits_and_says_so(
    db: database.Database, fake_comfy_factory
) -> None:
    fake = await fake_comfy_factory()
    url = fake.url
    await fake.kill()
    job = await enqueue(db)
    async with running_worker(db, [url]):
        async def told() -> bool:
            current = await db.jobs.get(job.id)
            assert current is not None
            return current.progress.get("text") == "waiting for a GPU"

        await wait_for(told, timeout=10)
        await fake.start()  # same port
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=20)
    assert done.attempts == 1 and fake.executions[str(job.id)] == 1


class _Recorder:
    """A delivery sink that remembers what it was given."""

    name = "chat"

    def __init__(self) -> None:
        self.delivered: list[jobs.Job] = []

    async def deliver(self, job: jobs.Job, outputs: object) -> None:
        self.delivered.append(job)


async def test_a_remote_workers_result_reaches_the_bot_at_once_and_once(
    db: database.Database, fake_comfy_factory
) -> None:
    remote_gpu, bot_gpu = await fake_comfy_factory(), await fake_comfy_factory()
    bot_side = _Recorder()
    # The bot's own worker would catch up on undelivered results only after a minute:
    # the result must arrive through the job's notification, not the catch-up scan.
    patient = dataclasses.replace(FAST, delivery_grace=60.0)
    await db.commands.seed()
    wf = workflow.find("f")
    values = wf.validate({"prompt": "a fox", "steps": 2, "width": 256, "height": 256})
    async with pool.Pool([config.BackendConfig("bot-gpu", bot_gpu.url, via="direct")],
                         probe_interval=0.2) as bot_pool, \
            running_worker(db, [remote_gpu.url]):  # the GPU host's worker: gpu0, no sink
        bot_worker = Worker(db, bot_pool, sinks=[bot_side], options=patient)
        bot_task = asyncio.create_task(bot_worker.run())
        try:
            job = await db.jobs.enqueue(jobs.NewJob(
                user_id=1, chat_id=1, command="f", workflow_hash=wf.hash, params=values,
                backends=("gpu0",),  # only the remote worker may run it
            ))
            await wait_status(db, job.id, jobs.Status.SUCCEEDED)
            finished = time.monotonic()
            # The catch-up scan would take delivery_grace (60 s): far more than any load adds.
            await wait_for(lambda: _now(len(bot_side.delivered) == 1), timeout=20)
            assert time.monotonic() - finished < 20
            # and no second delivery follows (the notification and a catch-up round)
            await never(lambda: _now(len(bot_side.delivered) > 1), within=1.5)
        finally:
            bot_worker.stop()
            await asyncio.wait_for(bot_task, 30)
    assert [j.id for j in bot_side.delivered] == [job.id]
    assert remote_gpu.executions[str(job.id)] == 1 and not bot_gpu.executions


async def _now(value: bool) -> bool:
    return value
