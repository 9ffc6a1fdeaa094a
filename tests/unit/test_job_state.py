"""The job state every front end shows (desk/state.py), from the job's row."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

from comfyveil import i18n
from comfyveil.cli import submit as cli_submit
from comfyveil.desk import state as job_state
from comfyveil.desk import words
from comfyveil.store import jobs
from comfyveil.telegram import render

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
Stage = job_state.Stage


def job(status: str = "running", attempts: int = 1, **fields: Any) -> jobs.Job:
    base = jobs.Job(
        id=uuid.UUID(int=1),
        idempotency_key=None,
        user_id=1,
        chat_id=1,
        command="f",
        workflow_hash="h",
        params={},
        backends=None,
        status=jobs.Status(status),
        submitted=True,
        backend="gpu1",
        attempts=attempts,
        max_attempts=3,
        priority=0,
        lease_owner="w",
        lease_expires_at=None,
        not_before=None,
        cancel_requested=False,
        error=None,
        status_message_id=None,
        progress={},
        created_at=NOW - dt.timedelta(minutes=2),
        started_at=NOW - dt.timedelta(seconds=100),
        finished_at=None,
        updated_at=NOW,
    )
    return dataclasses.replace(base, **fields)


def test_a_prompt_in_the_gpus_queue_waits_and_running_counts_from_its_start() -> None:
    pending = job(progress={"state": "queued_on_backend", "position": 1, "backend": "gpu1"})
    seen = job_state.of(pending, now=NOW)
    assert seen.stage is Stage.WAITING_GPU and seen.gpu_place == 1 and seen.running_s is None
    started = job(
        progress={"state": "running", "value": 3, "max": 20, "percent": 15.0},
        executing_at=NOW - dt.timedelta(seconds=4),
    )
    seen = job_state.of(started, now=NOW)
    # claimed 100 s ago, but ComfyUI started it 4 s ago
    assert seen.stage is Stage.RUNNING and seen.running_s == 4.0 and seen.step == 3


def test_states_never_go_back_across_polls_but_a_retry_starts_again() -> None:
    memory = job_state.StateMemory()
    jid = uuid.UUID(int=1)
    reads = [
        job(progress={"state": "submitted", "backend": "gpu1"}),
        job(progress={"state": "running"}, executing_at=NOW),
        job(progress={"state": "queued_on_backend", "position": 1}),  # a stale read
        job(progress={"state": "running", "value": 5, "max": 20}, executing_at=NOW),
    ]
    shown = [memory.shown(jid, job_state.of(j, now=NOW)).stage for j in reads]
    assert shown == [Stage.WAITING_GPU, Stage.RUNNING, Stage.RUNNING, Stage.RUNNING]
    # A retry after a transient error is a new attempt: queued again, said so.
    again = memory.shown(jid, job_state.of(job("queued", attempts=1), place=2))
    assert again.stage is Stage.QUEUED and again.place == 2
    # ...and its place in the queue only moves forward.
    assert memory.shown(jid, job_state.of(job("queued", attempts=1), place=5)).place == 2


def test_a_list_of_jobs_names_a_prompt_in_the_gpus_queue_as_waiting() -> None:
    # The web's history and the chat's /history read rows: the same stages.
    assert job_state.stage_of("running", "queued_on_backend") is Stage.WAITING_GPU
    assert job_state.stage_of("running", "submitted") is Stage.WAITING_GPU
    assert job_state.stage_of("running", "running") is Stage.RUNNING
    assert job_state.stage_of("running", "waiting") is Stage.QUEUED
    assert job_state.stage_of("succeeded", "running") is Stage.SUCCEEDED
    assert job_state.key(Stage.WAITING_GPU) == "waiting"


def test_a_results_caption_counts_the_run_from_comfyuis_start() -> None:
    from comfyveil.telegram import sink

    done = job(
        "succeeded",
        params={"seed": 5},
        created_at=NOW - dt.timedelta(seconds=40),
        started_at=NOW - dt.timedelta(seconds=39),  # claimed
        executing_at=NOW - dt.timedelta(seconds=4),  # 35 s in the GPU's queue first
        finished_at=NOW,
    )
    caption = sink.caption_for(done)
    assert "waited 36 s" in caption and "ran 4.0 s" in caption, caption


def test_the_first_in_line_reads_next_in_line_in_the_chat_the_web_and_the_cli() -> None:
    queued = job("queued", attempts=0)
    # The CLI (`submit --wait`, `jobs show`): not "queued #1" nor "0 job(s) ahead".
    first = cli_submit.describe_progress(queued, job_state.of(queued, place=1))
    assert first == "queued, next in line"
    assert cli_submit.describe_progress(queued, job_state.of(queued, place=3)) == "queued #3"
    # The chat says it with the same words, in the reader's language.
    view = render.JobView(id=str(queued.id), command="f", status="queued", position=1, eta_s=40)
    assert render.status_text(view) == "Queued · next in line · about 40 s"
    with i18n.using("ru"):
        assert "следующий в очереди" in render.status_text(view)
    # The web page shows the place as the same words for the first, a number after.
    assert words.next_in_line(1) and not words.next_in_line(2)
    assert not words.next_in_line(None)
