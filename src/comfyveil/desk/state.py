"""Where a job stands, one state machine for every front end (chat, web, CLI, `jobs show`).

    queued -> waiting on a GPU -> running -> succeeded | failed | cancelled

- queued: in our queue, with its place (1: next); a worker that claimed it and waits for
  a free GPU still holds it in our queue (no place then);
- waiting on a GPU: a ComfyUI backend accepted the prompt and holds it pending in its
  own queue (or it was just sent there);
- running: ComfyUI started the prompt (its execution_start): the running time counts
  from then, not from the claim or the submission;
- succeeded, failed, cancelled: the end.

States only move forward (`StateMemory`): a stale progress row read after a newer one,
or a place in a queue that grows, never takes a shown state back. A retry (a new
attempt after a transient error) starts again from queued, and says so.
"""

from __future__ import annotations

import collections
import datetime as dt
import enum
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from comfyveil.desk.words import STATUS_WORDS
from comfyveil.i18n import _
from comfyveil.store import jobs


class Stage(enum.IntEnum):
    QUEUED = 0
    WAITING_GPU = 1
    RUNNING = 2
    SUCCEEDED = 3
    FAILED = 4
    CANCELLED = 5

    @property
    def rank(self) -> int:
        """How far a job has come: the three ends are equally far."""
        return min(int(self), 3)

    @property
    def finished(self) -> bool:
        return self.rank == 3


# A job's state in a word or two, in every front end (msgids; said in the reader's language).
WORDS = {
    Stage.QUEUED: STATUS_WORDS["queued"],
    Stage.WAITING_GPU: STATUS_WORDS["waiting"],
    Stage.RUNNING: STATUS_WORDS["running"],
    Stage.SUCCEEDED: STATUS_WORDS["succeeded"],
    Stage.FAILED: STATUS_WORDS["failed"],
    Stage.CANCELLED: STATUS_WORDS["cancelled"],
}

_BY_STATUS = {
    jobs.Status.SUCCEEDED: Stage.SUCCEEDED,
    jobs.Status.FAILED: Stage.FAILED,
    jobs.Status.CANCELLED: Stage.CANCELLED,
}
# The worker's progress states (worker/job.py, worker/progress.py) before ComfyUI starts the prompt.
_ON_BACKEND = ("submitted", "queued_on_backend")


@dataclass(frozen=True)
class JobState:
    """What every front end says about a job now.

    Attributes:
        stage: where it stands.
        attempt: which try this is (a retry starts again from queued).
        place: its place in our queue (1: next), when queued and known.
        backend: the GPU it waits on or runs on.
        gpu_place: its place in that backend's own queue (1: next), when ComfyUI said.
        running_s: seconds since ComfyUI started it (running), or it ran (ended).
        percent, step, steps: the sampler's progress, when running.
        note: the worker's own sentence while it waits for a free GPU (an English
            msgid, said in the reader's language where it is shown).
    """

    stage: Stage
    attempt: int = 0
    place: int | None = None
    backend: str | None = None
    gpu_place: int | None = None
    running_s: float | None = None
    percent: float | None = None
    step: int | None = None
    steps: int | None = None
    note: str | None = None

    @property
    def word(self) -> str:
        """The state in a word, in the reader's language."""
        return _(WORDS[self.stage])


_KEYS = {
    Stage.QUEUED: "queued",
    Stage.WAITING_GPU: "waiting",
    Stage.RUNNING: "running",
    Stage.SUCCEEDED: "succeeded",
    Stage.FAILED: "failed",
    Stage.CANCELLED: "cancelled",
}


def stage_of(status: str, progress_state: str | None) -> Stage:
    """The stage from a job's status and its progress's state (a list of jobs' rows)."""
    if status == jobs.Status.RUNNING.value:
        if progress_state == "running":
            return Stage.RUNNING
        return Stage.WAITING_GPU if progress_state in _ON_BACKEND else Stage.QUEUED
    return _BY_STATUS.get(jobs.Status(status), Stage.QUEUED)


def key(stage: Stage) -> str:
    """The stage's key in `desk.words.STATUS_WORDS`."""
    return _KEYS[stage]


def of(job: jobs.Job, *, place: int | None = None, now: dt.datetime | None = None) -> JobState:
    """The state of `job` as its row says it (`place`: its place in our queue, if known)."""
    now = now or dt.datetime.now(dt.UTC)
    attempt = job.attempts if job.status is jobs.Status.QUEUED else max(job.attempts - 1, 0)
    if job.status is jobs.Status.QUEUED:
        return JobState(Stage.QUEUED, attempt, place=place)
    if job.status.finished:
        ran = None
        if job.executing_at is not None and job.finished_at is not None:
            ran = max(0.0, (job.finished_at - job.executing_at).total_seconds())
        return JobState(_BY_STATUS[job.status], attempt, backend=job.backend, running_s=ran)
    progress: dict[str, Any] = job.progress or {}
    state = progress.get("state")
    backend = _text(progress.get("backend")) or job.backend
    if state == "running":
        percent = progress.get("percent")
        running_s = None
        if job.executing_at is not None:
            running_s = max(0.0, (now - job.executing_at).total_seconds())
        return JobState(
            Stage.RUNNING,
            attempt,
            backend=backend,
            running_s=running_s,
            percent=float(percent) if _number(percent) else None,
            step=_int(progress.get("value")),
            steps=_int(progress.get("max")),
        )
    if state in _ON_BACKEND:
        position = _int(progress.get("position"))
        return JobState(
            Stage.WAITING_GPU,
            attempt,
            backend=backend,
            gpu_place=position if position is not None and position > 0 else None,
        )
    # Claimed by a worker, waiting for a free GPU (or not yet placed): still ours to queue.
    note = _text(progress.get("text")) if state == "waiting" else None
    return JobState(Stage.QUEUED, attempt, note=note)


class StateMemory:
    """The furthest state shown of each job, so that what a front end shows never goes
    back: a state behind the one shown (in the same attempt) shows as that one, with its
    running time counted on; a place in a queue never grows. Per process, for the most
    recent `size` jobs."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._shown: collections.OrderedDict[uuid.UUID, tuple[float, JobState]] = (
            collections.OrderedDict()
        )

    def shown(self, job_id: uuid.UUID, state: JobState) -> JobState:
        """What to show for `state`, read now."""
        now = time.monotonic()
        at, before = self._shown.get(job_id, (now, None))
        if before is not None and before.attempt == state.attempt:
            if state.stage.rank < before.stage.rank:
                # A stale read: what was shown stays, its running time counted on.
                ran = before.running_s
                if ran is not None and before.stage is Stage.RUNNING:
                    ran += now - at
                state = replace(before, running_s=ran)
            elif state.stage == before.stage:
                state = replace(
                    state,
                    place=_least(state.place, before.place),
                    gpu_place=_least(state.gpu_place, before.gpu_place),
                    step=state.step if state.step is not None else before.step,
                    steps=state.steps if state.steps is not None else before.steps,
                    percent=state.percent if state.percent is not None else before.percent,
                    running_s=state.running_s if state.running_s is not None else before.running_s,
                )
        elif before is not None and state.attempt < before.attempt:
            state = before
        self._shown[job_id] = (now, state)
        self._shown.move_to_end(job_id)
        while len(self._shown) > self._size:
            self._shown.popitem(last=False)
        return state

    def forget(self, job_id: uuid.UUID) -> None:
        self._shown.pop(job_id, None)


def _least(a: int | None, b: int | None) -> int | None:
    if a is None or b is None:
        return a
    return min(a, b)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: object) -> int | None:
    return int(value) if _number(value) else None  # type: ignore[call-overload]


def _text(value: object) -> str | None:
    return str(value) if isinstance(value, str) and value else None
