"""A job this worker runs, as it stands: its slot, its cancel state, the progress and
preview not yet written, and what it left on its backend."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

from comfyveil.comfy import execute, pool
from comfyveil.store import jobs


@dataclass(eq=False)
class Running:
    job: jobs.Job
    task: asyncio.Task[None] | None = None
    placed: asyncio.Event = field(default_factory=asyncio.Event)  # has a slot, or waits
    waiting: bool = False  # waits in the pool for a free GPU
    slot: pool.Slot | None = None
    cancel_requested: bool = False
    cancelling: bool = False
    # The final status is being written (or was): no more lease renewals or progress
    # writes. A renewal or progress write landing after that write finds the job no longer
    # running; it must not read that as a lost lease and cancel the delivery that follows.
    settled: bool = False
    progress_at: float = field(default_factory=time.monotonic)  # the last write (or claim)
    progress_due: float = math.inf  # when progress_next is written
    progress_sooner: asyncio.Event = field(default_factory=asyncio.Event)  # due moved earlier
    progress_next: dict[str, Any] | None = None  # the newest progress not yet written
    progress_task: asyncio.Task[None] | None = None
    progress_closed: bool = False  # the job left the backend: no more progress writes
    # When ComfyUI started the prompt (monotonic; None before): "running" counts from it.
    executing_since: float | None = None
    start_written: bool = False  # a write of the running state (with that start) went through
    # The sampler's first progress tick seen (node, value, monotonic time): its pace so far
    # tells the ETA what the steps left still need.
    steps_from: tuple[str | None, float, float] | None = None
    # Each sampler node's progress in this run (node -> (steps done, its steps)), in the
    # order they ran: a workflow with two samplers (Wan's high and low noise) is one count
    # of steps across both, not two counts that each end "done".
    sampler_steps: dict[str | None, tuple[float, int]] = field(default_factory=dict)
    # What its run measured (`routing.measured`: models loaded, their seconds), kept with
    # the job when it succeeds: the ETA learns what runs cost from the runs kept.
    measured: dict[str, Any] = field(default_factory=dict)
    # What the job left on its backend (no trace), removed once its final status is
    # written: until then a successor can still fetch its images.
    cleanup: list[execute.Cleanup] = field(default_factory=list)
    cleanup_on: pool.Backend | None = None
    # The backend's newest preview frame not yet written (mime, bytes), for a client that
    # asked to see partial images; None for `previews_wanted` until it has been asked.
    preview_next: tuple[str, bytes] | None = None
    previews_wanted: bool | None = None
    preview_task: asyncio.Task[None] | None = None
