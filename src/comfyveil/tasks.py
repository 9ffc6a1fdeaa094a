"""Stopping background tasks so that they do stop.

On Python 3.11 `asyncio.wait_for` can swallow a cancel that arrives just as the awaited
thing finishes (CPython gh-86296, fixed in 3.12). psycopg_pool waits for a free
connection with it, so a task cancelled at that moment carries on as if nothing
happened, and an `await task` after `task.cancel()` can wait forever (a web front end's
shutdown hung that way). Cancelling again until the task has ended closes the race;
our own waits with a deadline use `wait_for` here, which never swallows one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

RECANCEL_SECONDS = 0.5


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    """`asyncio.wait_for` without that flaw: `asyncio.timeout` (TimeoutError after
    `timeout` seconds) never swallows a cancel. Every wait of ours with a deadline goes
    through it: an API request's wait for its job, cancelled by a shutdown as the job's
    news arrived, carried on waiting, and the server's stop waited a minute for it."""
    async with asyncio.timeout(timeout):
        return await awaitable


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait until every one has ended; what they raise is dropped
    (a task stopped at shutdown has nobody left to report to)."""
    every = list(tasks)
    pending = {task for task in every if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
    for task in every:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it as never retrieved
