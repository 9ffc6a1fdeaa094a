"""A job as the jobs API tells it: its state in the one vocabulary every front end shares,
its place and ETA (the store's one estimate), progress, times, seed, outputs and a
failure in one plain sentence. Never the prompt nor the backend's own error text."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from comfyveil.api.context import ApiServices
from comfyveil.desk import failures
from comfyveil.desk.words import status_word
from comfyveil.store import api_jobs, eta, jobs

# The states a client reads; "waiting": claimed by a worker, waiting for a GPU to take it.
STATES = ("queued", "waiting", "running", "succeeded", "failed", "cancelled")
FINISHED = ("succeeded", "failed", "cancelled")


def state_of(status: jobs.Status | str, progress: dict[str, Any] | None) -> str:
    """The job's state word. The one place the API turns the desk's job status and its
    worker's progress into a state, so a shared state machine of the desk can take over
    here alone."""
    status = jobs.Status(status)
    if status is not jobs.Status.RUNNING:
        return status.value
    return "running" if (progress or {}).get("state") == "running" else "waiting"


def event_state(event: jobs.JobEvent) -> str:
    """The state a job entered with one of its history's events."""
    if event.status is not jobs.Status.RUNNING:
        return event.status.value
    return "running" if event.kind == "submitted" else "waiting"


def time_text(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z") if value else None


def _whole(value: object) -> int | None:
    """A step count as ComfyUI sends it (a number, at times a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def output_info(job_id: uuid.UUID, output: api_jobs.OutputInfo) -> dict[str, Any]:
    return {
        "index": output.index,
        "type": output.kind,
        "content_type": output.mime,
        "size": output.size,
        "url": f"/v1/jobs/{job_id}/outputs/{output.index}",
    }


async def describe(
    svc: ApiServices,
    job: jobs.Job,
    *,
    known: dict[str, Any] | None = None,
    estimate: bool = True,
    outputs: list[api_jobs.OutputInfo] | None = None,
    eta_read: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The job as GET /v1/jobs/{id} answers it. `known`: an earlier description of the
    same job in the same state (a stream's last), whose place and ETA stand while only
    its progress moved: the queue is not read again at each step. `estimate` False:
    no place nor ETA (null), for the answer to a submission, which reading the whole
    queue would slow down several times over. `outputs`: the succeeded job's outputs,
    when already read with it (None: read here). `eta_read`: what its ETA needs, when
    already read with it (`ApiJobStore.news`; None: read here if needed)."""
    state = state_of(job.status, job.progress)
    position = eta_seconds = None
    if known is not None and known.get("state") == state:
        position, eta_seconds = known.get("position"), known.get("eta_seconds")
    elif estimate and not job.status.finished:
        wait = await svc.db.jobs.wait(
            job.id,
            backends=eta.backends_up(svc.pool, svc.settings.backend_list()),
            slots=eta.slots_of(svc.settings.backend_list()),
            read=eta_read,
        )
        if wait is not None:
            eta_seconds = round(wait.seconds, 1) if wait.seconds is not None else None
            position = wait.ahead if wait.queued else None
    progress = job.progress or {}
    step, steps = _whole(progress.get("value")), _whole(progress.get("max"))
    percent = progress.get("percent")
    if job.status is jobs.Status.SUCCEEDED:
        step = steps
        percent = 100.0
    if job.status is not jobs.Status.SUCCEEDED:
        outputs = []
    elif outputs is None:
        outputs = await api_jobs.ApiJobStore(svc.db.pool).outputs(job.id)
    seed = job.params.get("seed")
    return {
        "id": str(job.id),
        "object": "job",
        "command": job.command,
        "state": state,
        "status_text": status_word(job.status.value),
        "position": position,
        "eta_seconds": eta_seconds,
        "progress": {
            "step": step,
            "steps": steps,
            "percent": float(percent) if isinstance(percent, int | float) else None,
        },
        "created_at": time_text(job.created_at),
        "started_at": time_text(job.started_at),
        "finished_at": time_text(job.finished_at),
        "seed": seed if isinstance(seed, int) else None,
        "outputs": [output_info(job.id, o) for o in outputs],
        "error": {"message": failures.sentence(job.error)}
        if job.status is jobs.Status.FAILED
        else None,
    }
