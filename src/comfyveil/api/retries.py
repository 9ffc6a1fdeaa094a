"""Retries that never pay twice: OpenAI's SDK (and the tools built on it) retries a
request that timed out or lost its connection with the same body and no
Idempotency-Key. A request is remembered in the database by a digest of its account and
body (`store/api_requests.py`); when its client goes away, a retry within the grace
period takes its jobs over (waiting, running, or finished and never handed out) instead
of queueing new ones. What nobody takes over is given up by `Sweeper`: jobs not yet on a
GPU are cancelled with their quota given back; jobs on one finish and are kept a while.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from comfyveil import metrics
from comfyveil import tasks as background
from comfyveil.store import api_requests

logger = logging.getLogger(__name__)

T = TypeVar("T")
WATCH = 0.05  # seconds between looks at a waiting request's connection
KEEPALIVE = 15.0  # seconds between a waiting stream's keep-alive comments


class Fingerprint:
    """A digest of what makes two requests the same: the route, the account and every
    field and file of the body, in order (never kept or logged as text). Keyed with the
    site's secret, so the database's copy cannot be matched against guessed prompts."""

    def __init__(self, route: str, account_id: int, secret: bytes) -> None:
        self._hash = hmac.new(secret, f"{route}\0{account_id}\0".encode(), hashlib.sha256)

    def add(self, name: str, data: bytes) -> None:
        self._hash.update(hashlib.sha256(name.encode()).digest())
        self._hash.update(hashlib.sha256(data).digest())

    def digest(self) -> bytes:
        return self._hash.digest()


def connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


async def unless_gone(
    request: web.Request,
    work: Awaitable[T],
    *,
    tick: Callable[[], Awaitable[None]] | None = None,
    every: float | None = None,
) -> tuple[bool, T | None]:
    """Run `work` while the client is connected: (True, its result), or (False, None) as
    soon as the client has gone (the work is stopped; the web server goes on with a
    handler whose client left, so the request must notice it itself). `tick` is called
    each `every` seconds meanwhile (a stream's keep-alive, so no proxy or client read
    timeout takes a long job's silence for a dead server)."""
    every = KEEPALIVE if every is None else every
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    due = loop.time() + every
    try:
        while not task.done():
            alive = connected(request)
            if alive and tick is not None and loop.time() >= due:
                due = loop.time() + every
                try:
                    await tick()
                except (ConnectionError, RuntimeError):
                    alive = False
            if not alive:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return False, None
            await asyncio.wait({task}, timeout=WATCH)
        # The work may end between two looks at a client that left meanwhile: an answer
        # nobody will read is no answer, so the request stays open for a retry.
        if not connected(request):
            return False, None
        return True, task.result()
    finally:
        if not task.done():  # this request itself was cancelled (shutdown)
            task.cancel()


def leave(
    store: api_requests.ApiRequestStore, row: asyncio.Future[int], *, handed: bool
) -> asyncio.Task[None]:
    """Note, in the background, that the request's client is done with its row: `handed`
    its answer, or gone without it (then a retry may take the jobs over)."""

    async def left() -> None:
        try:
            await store.leave(await row, handed=handed)
        except Exception as exc:  # the row stays open; the stale sweep drops it later
            logger.warning(
                "could not note that an API client left: %s",
                type(exc).__name__,
                extra={"action": "api_leave_failed"},
            )

    return asyncio.create_task(left(), name="api-leave")


class Sweeper:
    """Gives up, in every API process, the requests nobody came back for (several
    processes may sweep one database: each takes rows the others have not locked)."""

    def __init__(self, store: api_requests.ApiRequestStore, *, grace: float, keep: float) -> None:
        self.store = store
        self.grace = grace
        self.keep = keep
        self._task: asyncio.Task[None] | None = None

    @property
    def interval(self) -> float:
        return max(0.1, min(self.grace / 4, 5.0))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="api-retries")

    async def close(self) -> None:
        if self._task is not None:
            await background.cancel_and_wait([self._task])
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                cancelled = await self.store.settle(grace=self.grace, keep=self.keep)
                for job in cancelled:
                    logger.info(
                        "job of a request whose client went away given up",
                        extra={"action": "api_abandoned", "job_id": str(job.id)},
                    )
                    metrics.job_ended(job)  # a queued one ends now; a claimed one later
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next round tries again
                logger.warning(
                    "could not settle abandoned API requests: %s",
                    type(exc).__name__,
                    extra={"action": "api_settle_failed"},
                )
            await asyncio.sleep(self.interval)
