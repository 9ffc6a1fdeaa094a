from __future__ import annotations

import asyncio

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
