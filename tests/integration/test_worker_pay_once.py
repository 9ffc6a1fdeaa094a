"""Paying once when the network hiccups: a job re-queued after its prompt was accepted
must not be submitted a second time while the first prompt still runs on the GPU."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from comfyveil.comfy import health
from comfyveil.store import database, jobs
from comfyveil.worker.options import UNREACHABLE_WAIT
from tests.fakes.comfyui import FakeComfyUI
from tests.integration.worker_support import FAST, enqueue, running_worker, wait_for, wait_status

pytestmark = pytest.mark.timeout(120)


class _Recorder:
    """A delivery sink that remembers every job it was given."""

    name = "chat"

    def __init__(self) -> None:
        self.delivered: list[uuid.UUID] = []

    async def deliver(self, job: jobs.Job, outputs: object) -> None:
        self.delivered.append(job.id)


async def _hiccup_while_running(fake: FakeComfyUI, job: jobs.Job) -> None:
    """Once the job's prompt runs on the fake: drop the WebSocket and make the next
    /history fail, so the worker's look at the prompt ends in a transient error."""
    await wait_for(
        lambda: _now(fake.running is not None and fake.running.prompt_id == str(job.id)),
        timeout=10,
        interval=0.02,
    )
    fake.fail_requests("/history")
    await fake.drop_sockets()


def _posted(fake: FakeComfyUI, job: jobs.Job) -> int:
    return sum(1 for p in fake.prompts if p["prompt_id"] == str(job.id))


async def test_a_transient_error_after_acceptance_reattaches_and_pays_once(
    db: database.Database, fake_comfy_factory
) -> None:
    fake = await fake_comfy_factory(step_delay=0.2)
    sink = _Recorder()
    job = await enqueue(db, steps=8)
    async with running_worker(db, [fake.url], delivery=[sink]):
        await _hiccup_while_running(fake, job)
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
        await wait_for(lambda: _now(sink.delivered == [job.id]), timeout=5)
    kinds = [e.kind for e in await db.jobs.events(job.id)]
    assert "retry_scheduled" in kinds and done.attempts == 2  # the hiccup did happen
    assert fake.executions[str(job.id)] == 1 and _posted(fake, job) == 1
    assert done.backend == "gpu0" and len(await db.jobs.outputs(job.id)) == 1
    assert sink.delivered == [job.id] and await db.jobs.undelivered("chat") == []


async def test_cancel_of_a_job_requeued_after_it_was_sent_interrupts_its_prompt(
    db: database.Database, fake_comfy_factory
) -> None:
    fake = await fake_comfy_factory(step_delay=0.6)
    job = await enqueue(db, steps=8)
    patient = dataclasses.replace(FAST, retry_backoff=30.0)  # it stays queued meanwhile
    async with running_worker(db, [fake.url], options=patient):
        await _hiccup_while_running(fake, job)
        requeued = await wait_status(db, job.id, jobs.Status.QUEUED, timeout=10)
        assert requeued.attempts == 1
        assert fake.running is not None and fake.running.prompt_id == str(job.id)
        cancelled = await db.jobs.cancel(job.id)
        assert cancelled is not None and cancelled.status is jobs.Status.CANCELLED
        await wait_for(lambda: _now({"prompt_id": str(job.id)} in fake.interrupts), timeout=10)
        await wait_for(lambda: _now(str(job.id) in fake.history_entries), timeout=10)
    history = fake.history_entries[str(job.id)]
    assert history["status"]["messages"][-1][0] == "execution_interrupted"
    assert fake.executions[str(job.id)] == 1 and _posted(fake, job) == 1


async def test_a_job_whose_backend_went_down_is_taken_back_there_before_running_elsewhere(
    db: database.Database, fake_comfy_factory
) -> None:
    first = await fake_comfy_factory(step_delay=1.0)
    second = await fake_comfy_factory(step_delay=0.01)
    job = await enqueue(db, steps=8)
    # The retry waits until this test lets it go, once gpu0 is marked down: no guessed
    # delay (with 1 s, then 4 s, a loaded machine let the retry find gpu0 up first).
    patient = dataclasses.replace(FAST, retry_backoff=60.0)
    async with running_worker(db, [first.url, second.url], options=patient) as worker:
        await _hiccup_while_running(first, job)  # it starts on gpu0, the first idle one
        await wait_status(db, job.id, jobs.Status.QUEUED, timeout=10)
        # The pool now holds gpu0 for down (say its probes time out), though it still
        # answers: the retry must stop the prompt there, then run the job on gpu1.
        # A probe of gpu0 may be on its way right now (every 0.2 s here); its answer must
        # not bring gpu0 back up, as it did on a loaded machine (the retry re-attached).
        gpu0 = worker.pool.get("gpu0")
        gpu0.failures = 6
        await worker.pool.mark_down(gpu0, "probe timed out")
        async with db.pool.connection() as conn:
            await conn.execute("UPDATE jobs SET not_before = now() WHERE id = %s", (job.id,))
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
        await wait_for(lambda: _now(str(job.id) in first.history_entries), timeout=10)
    assert done.backend == "gpu1" and done.attempts == 2
    assert {"prompt_id": str(job.id)} in first.interrupts
    history = first.history_entries[str(job.id)]
    assert history["status"]["messages"][-1][0] == "execution_interrupted"
    assert first.executions[str(job.id)] == 1 and second.executions[str(job.id)] == 1


async def test_a_prompt_that_ended_while_its_backend_was_cut_off_is_followed_there(
    db: database.Database, fake_comfy_factory
) -> None:
    """The way to a GPU is cut (the bot host's anon killed) while the GPU finishes the
    prompt; it answers again, still marked down, when the retry asks it to drop the
    prompt, which is neither running nor waiting there any more: the result is taken
    there. It ran again on the other GPU (five prompts in a chaos run, seed 20261209)."""
    cut_off = await fake_comfy_factory(step_delay=0.2)
    second = await fake_comfy_factory(step_delay=0.01)
    job = await enqueue(db, steps=8)
    patient = dataclasses.replace(FAST, retry_backoff=60.0)  # released by the test below
    async with running_worker(db, [cut_off.url, second.url], options=patient) as worker:
        await _cut_off_while_running(cut_off, job)
        await wait_status(db, job.id, jobs.Status.QUEUED, timeout=10)
        await wait_for(lambda: _now(str(job.id) in cut_off.history_entries), timeout=15)
        gpu0 = worker.pool.get("gpu0")
        gpu0.failures = 6  # its next probe far off: still down when the retry comes
        await worker.pool.mark_down(gpu0, "probe timed out")
        await cut_off.heal()
        async with db.pool.connection() as conn:
            await conn.execute("UPDATE jobs SET not_before = now() WHERE id = %s", (job.id,))
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
    assert done.backend == "gpu0" and done.attempts == 2
    assert cut_off.executions[str(job.id)] == 1 and _posted(cut_off, job) == 1
    assert str(job.id) not in second.executions and _posted(second, job) == 0


async def test_a_prompt_left_on_an_unreachable_backend_is_taken_back_when_it_answers(
    db: database.Database, fake_comfy_factory
) -> None:
    cut_off = await fake_comfy_factory(step_delay=1.5)
    second = await fake_comfy_factory(step_delay=0.01)
    job = await enqueue(db, steps=8)
    # Cut off for longer than the retry waits for it (FAST's 2 s; the default, 60 s, in
    # the test below): the job runs elsewhere, and the prompt is taken back there later.
    async with running_worker(db, [cut_off.url, second.url]):
        await wait_for(
            lambda: _now(cut_off.running is not None and cut_off.running.prompt_id == str(job.id)),
            timeout=10,
            interval=0.02,
        )
        # A partition: gpu0 cannot be reached (nor asked to stop) but its GPU works on.
        await cut_off.partition()
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
        assert done.backend == "gpu1" and second.executions[str(job.id)] == 1
        assert cut_off.running is not None and cut_off.running.prompt_id == str(job.id)
        await cut_off.heal()
        await wait_for(lambda: _now(str(job.id) in cut_off.history_entries), timeout=15)
    assert {"prompt_id": str(job.id)} in cut_off.interrupts
    history = cut_off.history_entries[str(job.id)]
    assert history["status"]["messages"][-1][0] == "execution_interrupted"


async def test_a_prompt_on_a_backend_cut_off_for_a_while_is_followed_there_not_run_twice(
    db: database.Database, fake_comfy_factory
) -> None:
    """The bot's host loses its way to a GPU for a few seconds (its anon starting again)
    while the GPU runs the job's prompt to the end: the retry waits for that GPU to answer
    and takes the result there; it ran twice when the retry went to the other GPU."""
    cut_off = await fake_comfy_factory(step_delay=0.2)
    second = await fake_comfy_factory(step_delay=0.01)
    sink = _Recorder()
    job = await enqueue(db, steps=8)
    patient = dataclasses.replace(FAST, unreachable_wait=UNREACHABLE_WAIT)  # the default
    async with running_worker(
        db, [cut_off.url, second.url], delivery=[sink], options=patient
    ) as worker:
        await _cut_off_while_running(cut_off, job)
        # The attempt fails, the pool marks gpu0 down and the retry finds it so.
        await wait_for(lambda: _now(not worker.pool.get("gpu0").healthy), timeout=15)
        await wait_for(lambda: _now(str(job.id) in cut_off.history_entries), timeout=15)  # done
        await cut_off.heal()
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=60)
        await wait_for(lambda: _now(sink.delivered == [job.id]), timeout=5)
    assert done.backend == "gpu0" and done.attempts == 2
    assert cut_off.executions[str(job.id)] == 1 and _posted(cut_off, job) == 1
    assert str(job.id) not in second.executions and _posted(second, job) == 0
    assert len(await db.jobs.outputs(job.id)) == 1


async def test_while_a_retry_waits_for_its_cut_off_backend_other_jobs_run_on_the_others(
    db: database.Database, fake_comfy_factory
) -> None:
    cut_off = await fake_comfy_factory(step_delay=0.5)
    second = await fake_comfy_factory(step_delay=0.01)
    job = await enqueue(db, steps=8)
    patient = dataclasses.replace(FAST, unreachable_wait=UNREACHABLE_WAIT)  # the default
    async with running_worker(db, [cut_off.url, second.url], options=patient):
        await _cut_off_while_running(cut_off, job)

        await wait_for(lambda: _retry_waits(db, job), timeout=15)
        other = await enqueue(db, steps=2)
        done_other = await wait_status(db, other.id, jobs.Status.SUCCEEDED, timeout=15)
        assert done_other.backend == "gpu1"
        assert await _retry_waits(db, job)  # still waiting for gpu0, not run on gpu1
        await cut_off.heal()
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=60)
    assert done.backend == "gpu0" and cut_off.executions[str(job.id)] == 1
    assert str(job.id) not in second.executions


async def test_a_cancel_while_the_retry_waits_for_its_cut_off_backend_takes_the_prompt_back(
    db: database.Database, fake_comfy_factory
) -> None:
    cut_off = await fake_comfy_factory(step_delay=1.5)
    second = await fake_comfy_factory(step_delay=0.01)
    job = await enqueue(db, steps=8)
    patient = dataclasses.replace(FAST, unreachable_wait=UNREACHABLE_WAIT)  # the default
    async with running_worker(db, [cut_off.url, second.url], options=patient):
        await _cut_off_while_running(cut_off, job)

        await wait_for(lambda: _retry_waits(db, job), timeout=15)
        await db.jobs.cancel(job.id)
        ended = await wait_status(db, job.id, jobs.Status.CANCELLED, timeout=15)
        await cut_off.heal()
        await wait_for(
            lambda: _now({"prompt_id": str(job.id)} in cut_off.interrupts),
            timeout=health.BACKOFF_MAX + 10,
        )
    assert ended.attempts == 2 and str(job.id) not in second.executions


async def _cut_off_while_running(fake: FakeComfyUI, job: jobs.Job) -> None:
    """Once the job's prompt runs on the fake, cut the way to it (the GPU works on)."""
    await wait_for(
        lambda: _now(fake.running is not None and fake.running.prompt_id == str(job.id)),
        timeout=10,
        interval=0.02,
    )
    await fake.partition()


async def _retry_waits(db: database.Database, job: jobs.Job) -> bool:
    """Its second attempt holds it, not ended: the retry waits for the cut-off backend."""
    current = await db.jobs.get(job.id)
    return current is not None and current.attempts == 2 and not current.status.finished


async def _now(value: bool) -> bool:
    return value


async def test_a_cancel_that_lands_just_before_the_prompt_is_sent_stops_it_unsent(
    db: database.Database, fake_comfy_factory
) -> None:
    fake = await fake_comfy_factory()
    sink = _Recorder()
    job = await enqueue(db, steps=2)
    # Neither a NOTIFY nor a lease renewal brings the news first: the record of the backend
    # the prompt goes to is what refuses it.
    deaf = dataclasses.replace(FAST, listen=False, lease_seconds=60.0)
    async with running_worker(db, [fake.url], delivery=[sink], options=deaf) as worker:
        real = worker.store.mark_submitted

        async def cancelled_first(held: jobs.Job, backend: str) -> jobs.Job:
            await db.jobs.cancel(held.id)  # the user's cancel wins the race to the row
            return await real(held, backend)

        worker.store.mark_submitted = cancelled_first  # type: ignore[method-assign]
        done = await wait_status(db, job.id, jobs.Status.CANCELLED, timeout=20)
        await wait_for(lambda: _now(sink.delivered == [job.id]), timeout=5)
    assert not done.submitted and done.backend is None
    assert _posted(fake, job) == 0 and not fake.uploads and fake.history_entries == {}
    kinds = [e.kind for e in await db.jobs.events(job.id)]
    assert "lease_expired" not in kinds  # its worker ended it at once, not its lease


async def test_a_cancel_that_lands_as_the_backend_goes_away_ends_cancelled_not_failed(
    db: database.Database, fake_comfy_factory
) -> None:
    """The user cancels; before the worker hears of it, the GPU server goes away and the
    attempt fails with a transient error. The job ends cancelled (it ended "failed"),
    is never retried, and its prompt is taken back once the server answers again."""
    fake = await fake_comfy_factory(step_delay=3.0)
    sink = _Recorder()
    job = await enqueue(db, steps=8)
    async with running_worker(db, [fake.url], delivery=[sink]):
        await wait_for(
            lambda: _now(fake.running is not None and fake.running.prompt_id == str(job.id)),
            timeout=10, interval=0.02,
        )
        # The cancel as the store writes it, its notice not yet read by the worker...
        async with db.pool.connection() as conn:
            await conn.execute("UPDATE jobs SET cancel_requested = true WHERE id = %s",
                               (job.id,))
        await fake.partition()  # ...when the attempt meets the backend going away
        ended = await wait_status(db, job.id, jobs.Status.CANCELLED, timeout=20)
        assert ended.attempts == 1
        await wait_for(lambda: _now(sink.delivered == [job.id]), timeout=5)
        await fake.heal()
        # The pool sees it answer at its next probe, which the outage has backed off by up
        # to BACKOFF_MAX: a cancel that took 8 s under load left 16 s to the next one.
        await wait_for(
            lambda: _now({"prompt_id": str(job.id)} in fake.interrupts),
            timeout=health.BACKOFF_MAX + 10,
        )
    kinds = [e.kind for e in await db.jobs.events(job.id)]
    assert "retry_scheduled" not in kinds and "failed" not in kinds and kinds[-1] == "cancelled"
