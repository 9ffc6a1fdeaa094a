"""One job state in every front end (desk/state.py): a prompt a GPU holds pending in its
own queue is "waiting on a GPU" on the web page, in the chat and in `submit --wait`, never
"running"; the running time starts when ComfyUI starts the prompt; and what a front end
shows never goes back to an earlier state."""

from __future__ import annotations

import asyncio
import io
import re
import uuid
from typing import Any, cast

from comfyveil.cli import submit as cli_submit
from comfyveil.desk import state as job_state
from comfyveil.store import database, jobs
from comfyveil.telegram import status
from tests.integration.worker_support import enqueue, running_worker, wait_status
from tests.web.support import client, get_text, sign_up, wait_for, web_stack
from tests.web.test_web_jobs import JOB_URL, submit_form

HELD_S = 1.5  # how long the GPU holds the prompt pending before it may start


def _job_page_facts(page: str) -> tuple[str, str | None]:
    """The status word in the page's heading, and the "Elapsed" figure (None: not shown)."""
    word = re.search(r'<span class="status[^"]*">([^<]*)</span>', page)
    elapsed = re.search(r"<dt>Elapsed</dt><dd>([^<]*)</dd>", page)
    return (word.group(1) if word else ""), (elapsed.group(1) if elapsed else None)


async def test_a_prompt_pending_in_the_gpus_queue_is_waiting_not_running_everywhere(
    db: database.Database, fake_comfy_factory
) -> None:
    gpu = await fake_comfy_factory(step_delay=0.05)
    gpu.pause()  # the server takes prompts into its queue, and starts none yet
    async with web_stack(db, [gpu]) as stack, client() as session:
        await sign_up(session, await stack.invite(), "state")
        response = await submit_form(
            session,
            stack.url,
            "f",
            {"prompt": "a fox", "steps": "3", "width": "256", "height": "256"},
        )
        job_id = uuid.UUID(JOB_URL.search(str(response.url)).group(1))  # type: ignore[union-attr]

        async def pending_on_the_gpu() -> bool:
            job = await db.jobs.get(job_id)
            return (
                job is not None
                and (job.progress or {}).get("state") in ("submitted", "queued_on_backend")
                and any(p.prompt_id == str(job_id) for p in gpu.pending)
            )

        await wait_for(pending_on_the_gpu)
        job = await db.jobs.get(job_id)
        assert job is not None and job.executing_at is None
        assert job_state.of(job).stage is job_state.Stage.WAITING_GPU

        # The web page: the state in words, and no running time counting up.
        _, page = await get_text(session, f"{stack.url}/jobs/{job_id}")
        word, elapsed = _job_page_facts(page)
        assert word == "waiting on a GPU" and elapsed is None
        # The chat: not "Running on gpu0 · 0:01" while it waits there.
        tracker = status.StatusTracker(cast(Any, None), db)
        text = await tracker.text_for(job)
        assert "Running" not in text and text.startswith("Waiting on")
        # The CLI (`submit --wait`, `jobs show`).
        line = cli_submit.describe_progress(job, job_state.of(job))
        assert line.startswith("waiting on a GPU") and "running" not in line

        await asyncio.sleep(HELD_S)  # the prompt waits there a while: a timer would count
        gpu.resume()
        done = await wait_status(db, job_id, jobs.Status.SUCCEEDED)
        assert done.executing_at is not None and done.started_at is not None
        # "Running" counts from ComfyUI's start: the wait in the GPU's queue is not in it.
        waited = (done.executing_at - done.started_at).total_seconds()
        assert waited >= HELD_S * 0.9
        ran = job_state.of(done).running_s
        assert ran is not None and done.finished_at is not None
        assert ran <= (done.finished_at - done.started_at).total_seconds() - HELD_S * 0.9
        _, page = await get_text(session, f"{stack.url}/jobs/{job_id}")
        word, elapsed = _job_page_facts(page)
        assert word == "done" and elapsed is not None
        assert float(elapsed.split()[0]) < HELD_S


async def test_submit_wait_never_shows_an_earlier_state_after_a_later_one(
    db: database.Database, fake_comfy_factory
) -> None:
    # Two prompts on one GPU that takes two at a time: the second, queued once the first
    # runs there, waits in the GPU's own queue (queued together, either may go first).
    gpu = await fake_comfy_factory(step_delay=0.15)
    first = await enqueue(db, steps=8, user=1)
    out = io.StringIO()
    async with running_worker(db, [gpu.url], max_waiting=2):

        async def first_on_the_gpu() -> bool:
            return gpu.running is not None

        await wait_for(first_on_the_gpu)
        second = await enqueue(db, steps=2, user=2)
        await cli_submit.wait_for_job(db, second.id, out, poll=0.02)
        await wait_status(db, first.id, jobs.Status.SUCCEEDED)
    lines = out.getvalue().splitlines()
    order = {"queued": 0, "waiting on a GPU": 1, "running": 2}
    stages = [next(v for k, v in order.items() if line.startswith(k)) for line in lines]
    assert 1 in stages, lines  # it was seen waiting in the GPU's queue
    assert stages == sorted(stages), lines  # and never shown going back
