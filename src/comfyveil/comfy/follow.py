"""Following one submitted prompt to its end: over the backend's WebSocket, or by polling
/queue and /history when no events can come, telling the caller where it waits."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from comfyveil.comfy import errors, events
from comfyveil.comfy.results import RunResult, Tracker, result_from_history
from comfyveil.comfy.ws import LOST

# The name it logged under before the client was split, so log lines read as before.
log = logging.getLogger("comfyveil.comfy.client")

POSITION_GRACE = 0.25  # seconds a submitted prompt may take to start before its place is asked

EventCallback = Callable[[events.Event], Awaitable[None] | None]


class Following:
    """The following half of `ComfyClient`, which provides these attributes and the
    `queue`, `queue_remaining` and `history` requests."""

    name: str
    poll_interval: float
    check_interval: float

    async def _reconcile(self, prompt_id: str) -> RunResult | None:
        """History first, then the queue; raises JobLost when neither knows it."""
        result = await self._finished(prompt_id)
        if result is not None:
            return result
        state = await self.queue()
        if state.position(prompt_id) is not None:
            return None
        # It may have finished between the two calls: history is written together
        # with the removal from the queue, so a second look settles it.
        result = await self._finished(prompt_id)
        if result is not None:
            return result
        raise errors.JobLost(prompt_id, backend=self.name)

    async def _finished(self, prompt_id: str) -> RunResult | None:
        entry = await self.history(prompt_id)
        return None if entry is None else result_from_history(prompt_id, self.name, entry)

    async def _poll(self, prompt_id: str, on_event: EventCallback | None) -> RunResult:
        last: int | None = None
        while True:
            state = await self.queue()
            position = state.position(prompt_id)
            if position is None:
                # out of the queue: history was written in the same step, or it is lost
                entry = await self.history(prompt_id)
                if entry is None:
                    raise errors.JobLost(prompt_id, backend=self.name)
                result = result_from_history(prompt_id, self.name, entry)
                if result is not None:
                    return result
            elif position != last:
                last = position
                # Polled, no execution_start comes: the prompt in the queue's running part
                # is what that event would have said (running, not "next").
                event: events.Event = (
                    events.ExecutionStart(prompt_id, None)
                    if position == 0
                    else events.QueuePosition(prompt_id, position)
                )
                await _call_back(on_event, event)
            await asyncio.sleep(self.poll_interval)

    async def _emit_position(
        self, prompt_id: str, on_event: EventCallback | None, queue_remaining: int | None = None
    ) -> None:
        """Tell the caller where the prompt waits (when it has not started soon after
        submitting, and on each `status` the server broadcasts when its queue changes,
        until it starts). GET /queue carries every queued
        prompt in full, so it is asked only when the small count says others wait too."""
        if on_event is None:
            return
        if queue_remaining is None:
            queue_remaining = await self.queue_remaining()
        if queue_remaining <= 1:  # ours is the only prompt there: running, or next
            await _call_back(on_event, events.QueuePosition(prompt_id, 0))
            return
        position = (await self.queue()).position(prompt_id)
        if position is not None:
            await _call_back(on_event, events.QueuePosition(prompt_id, position))

    async def _follow_socket(
        self,
        prompt_id: str,
        queue: asyncio.Queue[Any],
        on_event: EventCallback | None,
        submitted_at: float = 0.0,
    ) -> RunResult:
        tracker = Tracker(prompt_id, self.name)
        # Where the prompt waits is asked only if it has not started within a moment: on an
        # idle backend (the usual case) it starts at once and the question costs a request.
        position_due = submitted_at + POSITION_GRACE if on_event is not None else None
        while not tracker.done:
            timeout = self.check_interval
            if position_due is not None:
                timeout = max(0.0, min(timeout, position_due - time.monotonic()))
            try:
                # Events come in bursts: take a waiting one without arming a timer.
                if queue.empty():
                    async with asyncio.timeout(timeout):
                        item = await queue.get()
                else:
                    item = queue.get_nowait()
            except TimeoutError:
                if position_due is not None:
                    position_due = None
                    await self._emit_position(prompt_id, on_event)
                    continue
                result = await self._reconcile(prompt_id)  # JobLost if it was cleared
                if result is not None:
                    return result
                continue
            if item is LOST:
                log.info("lost the event stream of backend %s; polling instead", self.name)
                result = await self._reconcile(prompt_id)
                return result if result is not None else await self._poll(prompt_id, on_event)
            arrived, event = item
            tracker.feed(event, arrived)
            if tracker.started:
                position_due = None
            if isinstance(event, events.Status) and not tracker.started and on_event is not None:
                # A status that arrived before our prompt was accepted may not count it; the
                # position asked for after the grace covers that case.
                if arrived >= submitted_at:
                    position_due = None
                    await self._emit_position(prompt_id, on_event, event.queue_remaining)
                continue
            if not isinstance(event, events.Status):
                await _call_back(on_event, event)
        return tracker.result()


async def _call_back(on_event: EventCallback | None, event: events.Event) -> None:
    if on_event is None:
        return
    result = on_event(event)
    if inspect.isawaitable(result):
        await result
