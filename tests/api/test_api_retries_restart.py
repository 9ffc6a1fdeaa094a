"""A retry that reaches a restarted server: the first try's process stopped while its
client waited, and the retry, sent to the process that replaced it, takes the first
try's job over instead of paying for a second one."""

from __future__ import annotations

import asyncio

import pytest

from tests.api import jobs_support
from tests.api.test_api_openai import PROMPT
from tests.api.test_api_retries import openai, statuses
from tests.web.support import wait_for


async def test_a_retry_after_a_restart_takes_over_its_first_trys_job(db, fake_comfy) -> None:
    async with jobs_support.stack(db, [fake_comfy], retry_grace=300.0) as s:
        key, _ = await s.key()
        fake_comfy.pause()  # the job is still to come when the server stops
        api = openai.AsyncOpenAI(base_url=f"{s.url}/v1", api_key=key, max_retries=0)
        first = asyncio.create_task(api.images.generate(model="f", prompt=PROMPT, size="256x256"))

        async def rows() -> list[tuple[int, int]]:
            async with s.db.pool.connection() as conn:
                cursor = await conn.execute("SELECT clients, attached FROM api_requests")
                return [(r["clients"], r["attached"]) for r in await cursor.fetchall()]

        async def waited_for() -> bool:
            return await rows() == [(1, 0)]

        await wait_for(waited_for, timeout=30)
        # The stopping server tells its waiting client to try again (the SDK retries a
        # 503), at once rather than after aiohttp's minute of waiting for the handler.
        await asyncio.wait_for(s.restart(), 30)
        with pytest.raises(openai.InternalServerError) as told:
            await first
        assert told.value.status_code == 503
        again = openai.AsyncOpenAI(base_url=f"{s.url}/v1", api_key=key, max_retries=0)
        retry = asyncio.create_task(again.images.generate(model="f", prompt=PROMPT, size="256x256"))

        async def taken_over() -> bool:
            return await rows() == [(1, 1)] or len(await statuses(s)) > 1

        await wait_for(taken_over, timeout=30)
        fake_comfy.resume()
        result = await retry
        assert await statuses(s) == ["succeeded"]  # one job, not two
        assert result.data[0].b64_json
