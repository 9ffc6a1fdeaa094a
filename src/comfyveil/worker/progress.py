"""Publishing a running job's progress: ComfyUI's events turned into progress rows (and
the pool told of the run's pace), and its preview frames, both written in the background
so the job never waits for them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from comfyveil import tasks as background
from comfyveil.comfy import events
from comfyveil.comfy.costs import steps_of
from comfyveil.comfy.progress_line import shows_steps
from comfyveil.store import errors as store_errors
from comfyveil.store import previews
from comfyveil.worker.options import PROGRESS_INTERVAL, PROGRESS_SETTLE
from comfyveil.worker.running import Running

logger = logging.getLogger("comfyveil.worker")  # the name it logged under before the split


PREVIEW_INTERVAL = 0.25  # seconds between two preview writes of one job


class Reporting:
    """The progress part of `Worker` (which it is mixed into)."""

    def _progress_callback(
        self, running: Running, graph: Mapping[str, Any]
    ) -> Callable[[events.Event], Awaitable[None]]:
        node_types = {k: str(v.get("class_type", "")) for k, v in graph.items()}

        async def on_event(event: events.Event) -> None:
            data: dict[str, Any] | None = None
            force = False
            if isinstance(event, events.QueuePosition):
                data = {"state": "queued_on_backend", "position": event.position}
                force = True
            elif isinstance(event, events.ExecutionStart):
                running.executing_since = time.monotonic()
                data = {"state": "running"}
                force = True
                if running.slot is not None:  # its GPU's backlog counts from its progress now
                    self.pool.progress(running.slot, started=True)
            elif isinstance(event, events.Executing) and event.node is not None:
                data = {"state": "running", "node": event.node}
            elif isinstance(event, events.Progress) and shows_steps(event, node_types):
                done, steps = _across_samplers(
                    running, event.node, float(event.value), int(event.max)
                )
                percent = round(100.0 * done / steps, 1) if steps else None
                data = {
                    "state": "running",
                    "node": event.node,
                    "value": done,
                    "max": steps,
                    "percent": percent,
                }
                pace = _step_seconds(running, event.node, float(event.value))
                if pace is not None:
                    data["step_s"] = round(pace, 4)
                if running.slot is not None:
                    self.pool.progress(running.slot, done=done, steps=steps, step_s=pace)
            elif isinstance(event, events.Preview):
                self._record_preview(running, event)
            if data is not None and data["state"] == "running" and running.executing_since is None:
                # Re-attached to a prompt that started before (its start is kept in the
                # store), or an event stream that skipped it: running from now at the latest.
                running.executing_since = time.monotonic()
            if data is not None:
                slot = running.slot
                if slot is not None:
                    data["backend"] = slot.backend.name
                self._record_progress(running, data, force=force)

        return on_event

    def _record_preview(self, running: Running, event: events.Preview) -> None:
        """Keep the newest preview frame for the job's client, written in the background
        (never on the job's path), at most every PREVIEW_INTERVAL, and only for a job
        whose client asked for partial images."""
        if running.progress_closed or running.previews_wanted is False:
            return
        running.preview_next = (event.mime, event.image)
        if running.preview_task is None or running.preview_task.done():
            task = asyncio.create_task(
                self._write_previews(running), name=f"preview-{running.job.id}"
            )
            running.preview_task = task
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)

    async def _write_previews(self, running: Running) -> None:
        store = previews.PreviewStore(self.db.pool)
        try:
            if running.previews_wanted is None:
                running.previews_wanted = await store.wanted(running.job.id)
            while running.previews_wanted and not running.progress_closed:
                frame, running.preview_next = running.preview_next, None
                if frame is None:
                    return
                await store.save(running.job.id, *frame)
                await asyncio.sleep(PREVIEW_INTERVAL)
        except store_errors.StoreError as exc:  # previews are best effort
            logger.info("preview not saved: %s", exc, extra={"action": "preview_unsaved"})

    def _record_progress(
        self, running: Running, data: Mapping[str, Any], *, force: bool = False
    ) -> None:
        """Save the job's progress in the background, the latest first.

        The job never waits for its progress row: events from the backend keep flowing
        while a write is pending, and they collapse into the newest one. Writes trail the
        events, a change of state by PROGRESS_SETTLE, progress by up to PROGRESS_INTERVAL
        after the last write, so a job that ends sooner writes none: its final status says
        all. A cancel request read back with a write cancels the job.
        """
        if running.progress_closed:
            return
        now = time.monotonic()
        due = now + PROGRESS_SETTLE if force else max(now, running.progress_at + PROGRESS_INTERVAL)
        if due < running.progress_due:
            running.progress_due = due
            running.progress_sooner.set()
        running.progress_next = dict(data)
        if running.progress_task is None or running.progress_task.done():
            task = asyncio.create_task(
                self._write_progress(running), name=f"progress-{running.job.id}"
            )
            running.progress_task = task
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)

    async def _write_progress(self, running: Running) -> None:
        while running.progress_next is not None and not running.progress_closed:
            while (wait := running.progress_due - time.monotonic()) > 0:
                running.progress_sooner.clear()
                with contextlib.suppress(TimeoutError):
                    await background.wait_for(running.progress_sooner.wait(), wait)
            if running.progress_closed or running.progress_next is None:
                return
            data, running.progress_next = running.progress_next, None
            running.progress_at, running.progress_due = time.monotonic(), math.inf
            try:
                since = running.executing_since if data.get("state") == "running" else None
                cancel = await self.store.record_progress(
                    running.job,
                    data,
                    executing_for=None if since is None else max(0.0, time.monotonic() - since),
                )
                running.start_written = running.start_written or since is not None
            except store_errors.LeaseLost:
                if running.progress_closed or running.settled:
                    return  # the job ended meanwhile: its final status is the last word
                logger.warning(
                    "lease lost; dropping the job here",
                    extra={"action": "lease_lost", "job_id": str(running.job.id)},
                )
                running.cancelling = True
                if running.task is not None and not running.task.done():
                    running.task.cancel()
                return
            except store_errors.StoreError as exc:  # progress is best effort
                logger.info("progress not saved: %s", exc, extra={"action": "progress_unsaved"})
                continue
            if cancel:
                self._request_cancel(running)


def _across_samplers(
    running: Running, node: str | None, value: float, maximum: int
) -> tuple[float | int, int]:
    """The run's steps done and its steps in all, across its sampler nodes: a sampler
    that a later one followed counts as done, and the steps asked for (the `steps`
    option, which Wan's two samplers split between them) are the least there are.
    Before, each sampler's count was shown and weighed alone: Wan's first looked done
    after half the steps, and the ETA then jumped back up by the other half."""
    running.sampler_steps[node] = (value, maximum)
    done = 0.0
    seen = 0
    for other, (ticks, its_steps) in running.sampler_steps.items():
        done += ticks if other == node else its_steps
        seen += its_steps
    asked = steps_of(running.job.params)
    steps = max(seen, asked or 0)
    return (int(done) if done.is_integer() else done), steps


def _step_seconds(running: Running, node: str | None, value: float) -> float | None:
    """Seconds a sampler step took so far in this run (from its first tick seen to this
    one); None until two ticks of one node were seen."""
    now = time.monotonic()
    first = running.steps_from
    if first is None or first[0] != node or value <= first[1]:
        running.steps_from = (node, value, now)
        return None
    return (now - first[2]) / (value - first[1])
