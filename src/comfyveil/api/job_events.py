"""``GET /v1/jobs/{id}/events``: Server-Sent Events of a job, ending with its final state.

Two kinds of event, each with an id ``E.U`` that only grows: ``state`` for each entry of
the job's stored history (``E``: its row in `job_events`), and ``job``, the whole job as
``GET /v1/jobs/{id}`` tells it, whenever it changed (``U``: its last change, in
microseconds). A client that reconnects with ``Last-Event-ID`` gets every state entry
after ``E`` and the job once more if it changed after ``U``: nothing is missed, across a
restart of the server too, as both live in the database. The stream is woken by the
store's notifications (the images API's listener), with a slow re-read as a fallback: news
of a job that goes on is gathered for a moment (SETTLE) and read once, news of its end at
once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiohttp import web
from aiohttp_sse import EventSourceResponse, sse_response

from comfyveil.api import job_view
from comfyveil.api.context import ACCOUNT, caller
from comfyveil.api.jobs import _store, job_uuid, no_job
from comfyveil.store import api_jobs

logger = logging.getLogger(__name__)

FALLBACK = 5.0  # seconds between re-reads when no news arrives
# Seconds the news of a job that goes on (claimed, sent to the GPU, progress) waits to be
# read: a burst of it is read once, and not beside the worker's own writes on the job's
# path. News that may be the end is read at once.
SETTLE = 0.2
RETRY_MS = 1000  # what a client waits before reconnecting (the SSE "retry" field)
CLOSING = web.AppKey("api_job_streams_closing", asyncio.Event)


def _last(header: str) -> tuple[int, int]:
    event, _sep, update = header.strip().partition(".")
    try:
        return max(0, int(event)), max(0, int(update or 0))
    except ValueError:
        return 0, 0


def _micros(job: Any) -> int:
    return int(job.updated_at.timestamp() * 1_000_000)


async def stream(request: web.Request) -> web.StreamResponse:
    svc, _who = await caller(request)
    job_id = job_uuid(request)
    sent_event, sent_update = _last(request.headers.get("Last-Event-ID", ""))
    closing = request.app[CLOSING]
    store = _store(svc)
    # watched before the first read, so that news after that read wakes the wait below
    with svc.waiter.watching(job_id) as watch:
        # the first read also tells whose job it is: no read of the job before it; and
        # what its ETA needs, which the first description of a job not ended tells
        read: api_jobs.News | None = await store.news(job_id, sent_event, eta=True)
        if read.job is None or read.job.user_id != request[ACCOUNT].user_id:
            raise no_job(str(job_id))
        async with sse_response(
            request, headers={"Cache-Control": "no-store"}, response_cls=EventStream
        ) as sse:
            first = True
            described: dict[str, Any] | None = None
            with contextlib.suppress(ConnectionError):
                while not closing.is_set():
                    if read is None:
                        watch.clear()  # before the reads: news after them wakes the wait
                        read = await store.news(job_id, sent_event)
                    batch: list[tuple[str, str, str, int | None]] = []
                    for event in read.events:
                        sent_event = event.id
                        data = {
                            "id": str(job_id),
                            "state": job_view.event_state(event),
                            "at": job_view.time_text(event.at),
                        }
                        retry = RETRY_MS if first else None
                        batch.append((json.dumps(data), f"{sent_event}.0", "state", retry))
                        first = False
                        sent_update = 0
                    found, outputs, waits, read = read.job, read.outputs, read.eta, None
                    if found is not None and _micros(found) > sent_update:
                        sent_update = _micros(found)
                        described = await job_view.describe(
                            svc, found, known=described, outputs=outputs, eta_read=waits
                        )
                        batch.append(
                            (json.dumps(described), f"{sent_event}.{sent_update}", "job", None)
                        )
                    # ended, or forgotten meanwhile: nothing more will come, and the last
                    # events leave with the stream's end
                    last = found is None or found.status.finished
                    await sse.send_together(batch, end=last)
                    if last:
                        break
                    await _first(watch.news, closing, timeout=FALLBACK)
                    if watch.news.is_set() and not closing.is_set():
                        await _first(watch.ended, closing, timeout=SETTLE)
    return sse


class EventStream(EventSourceResponse):
    """A stream whose events of one read go out in one write (the headers with the first,
    the stream's end with the last): one packet and one wake-up of the client where each
    event was one, on the CPUs the job's worker and its GPU's answers need meanwhile."""

    gathering = False
    _gathered = b""

    async def write(self, data: bytes) -> None:
        if self.gathering:
            self._gathered += data
            return
        data, self._gathered = self._gathered + data, b""
        await super().write(data)

    async def write_eof(self, data: bytes = b"") -> None:
        data, self._gathered = self._gathered + data, b""
        await super().write_eof(data)

    async def send_together(
        self, events: list[tuple[str, str, str, int | None]], *, end: bool
    ) -> None:
        """Send `events` (data, id, event, retry) in one write; `end`: with the stream's
        end, which follows at once (the server writes it when the handler returns)."""
        for index, (data, id_, event, retry) in enumerate(events):
            self.gathering = end or index < len(events) - 1
            try:
                await self.send(data, id=id_, event=event, retry=retry)
            finally:
                self.gathering = False


async def _first(*events: asyncio.Event, timeout: float) -> None:
    """Wait until one of `events` is set, or `timeout` seconds."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


async def close_streams(app: web.Application) -> None:
    """On shutdown: end every stream, so the server need not wait for them and their
    clients reconnect (to this server's successor) with Last-Event-ID."""
    app[CLOSING].set()
