from __future__ import annotations

import asyncio
import contextlib

from comfyveil import tasks


async def _swallows_the_first_cancel(ended: asyncio.Event) -> None:
    # what asyncio.wait_for does on Python 3.11 when a result races the cancel
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        pass
    try:
        await asyncio.sleep(30)
    finally:
        ended.set()


async def test_a_task_that_swallowed_a_cancel_is_still_stopped() -> None:
    ended = asyncio.Event()
    task = asyncio.create_task(_swallows_the_first_cancel(ended))
    await asyncio.sleep(0)
    await asyncio.wait_for(tasks.cancel_and_wait([task]), 5)
    assert ended.is_set() and task.done()


async def test_a_failed_task_does_not_stop_the_others_from_being_stopped() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails())
    sleeper = asyncio.create_task(asyncio.sleep(30))
    await asyncio.sleep(0)
    await asyncio.wait_for(tasks.cancel_and_wait([failed, sleeper]), 5)
    assert sleeper.cancelled() and isinstance(failed.exception(), RuntimeError)


async def test_a_wait_cancelled_as_its_event_is_set_ends_cancelled() -> None:
    """Python 3.11's asyncio.wait_for returns the event's result instead: a loop waiting
    on news (an API request waiting for its job) ran on, cancelled in name only, and the
    server's stop waited a minute for it. Ours (tasks.wait_for) ends the task."""
    news = asyncio.Event()
    rounds = 0

    async def waiting_for_news() -> None:
        nonlocal rounds
        while True:
            news.clear()
            with contextlib.suppress(TimeoutError):
                await tasks.wait_for(news.wait(), 10)
            rounds += 1

    waiting = asyncio.ensure_future(waiting_for_news())
    await asyncio.sleep(0.05)
    news.set()  # the news and the cancel land in the same turn of the loop
    waiting.cancel()
    await asyncio.sleep(0.05)
    assert waiting.cancelled() and rounds == 0
