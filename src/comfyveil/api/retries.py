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
from comfyveil.store import errors as store_errors

logger = logging.getLogger(__name__)

T = TypeVar("T")
WATCH = 0.05  # seconds between looks at a waiting request's connection
KEEPALIVE = 15.0  # seconds between a waiting stream's keep-alive comments
# A request whose jobs are queued rides out the database not answering (a restart, a
# crash recovery) for this long before it answers 503: its jobs go on meanwhile, and a
# blink of a few seconds should cost its client nothing.
OUTAGE = 60.0
BACKOFF = (0.1, 2.0)  # seconds between reads while the database is down: first, most
LEAVE_FOR = 600.0  # seconds a leave is retried while the database is down
LEAVE_WAIT = 5.0  # seconds an ending request (or its retry) waits for its leave's note


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


async def through_outage(
    read: Callable[[], Awaitable[T]], *, bound: float | None = None, most: float | None = None
) -> T:
    """`read()`, tried again with a growing pause (up to `most` seconds) while the
    database is unreachable, for up to `bound` seconds (OUTAGE) of it; then its error
    goes on."""
    bound = OUTAGE if bound is None else bound
    most = BACKOFF[1] if most is None else most
    loop = asyncio.get_running_loop()
    since: float | None = None
    pause = BACKOFF[0]
    while True:
        try:
            return await read()
        except store_errors.DatabaseUnreachable:
            now = loop.time()
            since = now if since is None else since
            if now - since >= bound:
                raise
            await asyncio.sleep(min(pause, max(bound - (now - since), 0.0)))
            pause = min(pause * 2, most)


def connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


async def unless_gone(
    request: web.Request,
    work: Awaitable[T],
    *,
    tick: Callable[[], Awaitable[None]] | None = None,
    every: float | None = None,
    stop: asyncio.Event | None = None,
) -> tuple[bool, T | None]:
    """Run `work` while the client is connected: (True, its result), or (False, None) as
    soon as the client has gone (the work is stopped; the web server goes on with a
    handler whose client left, so the request must notice it itself). `tick` is called
    each `every` seconds meanwhile (a stream's keep-alive, so no proxy or client read
    timeout takes a long job's silence for a dead server). A set `stop` (this process is
    shutting down) ends the wait as a gone client does."""
    every = KEEPALIVE if every is None else every
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    due = loop.time() + every
    try:
        while not task.done():
            alive = connected(request) and not (stop is not None and stop.is_set())
            if alive and tick is not None and loop.time() >= due:
                due = loop.time() + every
                try:
                    await tick()
                except (ConnectionError, RuntimeError):
                    alive = False
            if not alive:
                # Cancelled again until it ends: a cancel landing as a read of the work
                # finishes can be swallowed (tasks.py), and the work then waited on.
                await background.cancel_and_wait([task])
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
    its answer, or gone without it (then a retry may take the jobs over). Tried again
    while the database is down: a leave never written keeps the row counted as waited
    on, and the client's retry would pay anew instead of taking the jobs over."""

    async def left() -> None:
        try:
            request_id = await row
            # often: a retry, maybe on another process, may be looking for this row now
            await through_outage(
                lambda: store.leave(request_id, handed=handed), bound=LEAVE_FOR, most=0.5
            )
        except Exception as exc:  # the row stays open; the stale sweep drops it later
            logger.warning(
                "could not note that an API client left: %s",
                type(exc).__name__,
                extra={"action": "api_leave_failed"},
            )

    return asyncio.create_task(left(), name="api-leave")


class Visit:
    """One request's hold on its row, let go of once: by the request when it ends, or
    sooner by a retry that finds this request's client gone."""

    def __init__(self, fingerprint: bytes, request: web.Request, row: asyncio.Future[int]):
        self.fingerprint = fingerprint
        self.request = request
        self.row = row
        self.left: asyncio.Task[None] | None = None
        self.ended = False  # its handler is done: its client never gets its answer now


class Visits:
    """The requests this process answers now that hold a row, by digest. The first try
    looks at its connection only now and then (`WATCH`), and notes its leave in the
    background; a retry that arrives before that note is written lets the first try's
    row go itself (its client is gone: it can never be handed its answer) and takes it
    over, instead of queueing and paying anew."""

    def __init__(self, store: api_requests.ApiRequestStore, leaving: set[asyncio.Task[None]]):
        self.store = store
        self.leaving = leaving
        self._by: dict[bytes, set[Visit]] = {}

    def enter(self, fingerprint: bytes, request: web.Request, row: asyncio.Future[int]) -> Visit:
        visit = Visit(fingerprint, request, row)
        self._by.setdefault(fingerprint, set()).add(visit)
        return visit

    def end(self, visit: Visit, *, handed: bool) -> asyncio.Task[None]:
        """The request is over; its leave is noted unless a retry noted it first. One
        not handed its answer stays known until its leave is written (a retry here then
        waits for that note, instead of finding the row still waited on)."""
        visit.ended = True
        task = self._leave(visit, handed=handed)
        if handed or task.done():
            self._forget(visit)
        else:
            task.add_done_callback(lambda _: self._forget(visit))
        return task

    def _forget(self, visit: Visit) -> None:
        same = self._by.get(visit.fingerprint)
        if same is not None:
            same.discard(visit)
            if not same:
                del self._by[visit.fingerprint]

    async def let_go_of_gone(self, fingerprint: bytes) -> bool:
        """Note the leave of this digest's requests whose client is gone, or that ended
        without handing their answer (True: some)."""
        gone = [v for v in self._by.get(fingerprint, ()) if v.ended or not connected(v.request)]
        tasks = [self._leave(v, handed=False) for v in gone]
        if tasks:
            await asyncio.wait(tasks, timeout=LEAVE_WAIT)
        return bool(tasks)

    def _leave(self, visit: Visit, *, handed: bool) -> asyncio.Task[None]:
        if visit.left is None:  # once: a second leave would free a retry's row
            visit.left = leave(self.store, visit.row, handed=handed)
            self.leaving.add(visit.left)
            visit.left.add_done_callback(self.leaving.discard)
        return visit.left


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
