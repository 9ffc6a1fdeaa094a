"""Retries never pay twice: OpenAI's SDK retries a request that timed out with the same
body and no Idempotency-Key; the retry takes over the jobs its first try queued. A job
nobody comes back for is cancelled if it never reached a GPU (its quota given back) and
kept for a retry if it did. Two identical requests that are both alive are two."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
from collections.abc import Callable

import httpx
import pytest
from PIL import Image

from comfyveil import config
from comfyveil.api import retries
from tests.api.test_api_openai import PROMPT, make_key
from tests.lazy import lazy_import
from tests.web.support import client, sign_up, wait_for, web_stack

openai = lazy_import("openai")  # loaded by the first test that uses it

FAST_GRACE = config.ApiConfig(retry_grace=0.3, retry_keep=300.0)


def counting(sent: list[httpx.Request]) -> httpx.AsyncClient:
    """An HTTP client for the SDK that notes each request it sends (each try)."""

    async def note(request: httpx.Request) -> None:
        sent.append(request)

    return openai.DefaultAsyncHttpxClient(event_hooks={"request": [note]})


async def statuses(stack) -> list[str]:
    async with stack.db.pool.connection() as conn:
        rows = await (await conn.execute("SELECT status FROM jobs ORDER BY created_at")).fetchall()
    return [str(r["status"]) for r in rows]


async def until(check: Callable[[], bool]) -> None:
    async def met() -> bool:
        return check()

    await wait_for(met, timeout=30, interval=0.02)


async def test_the_sdks_own_retries_after_timeouts_get_one_job_and_its_image(
    db, fake_comfy
) -> None:
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "tim")
        key = await make_key(session, stack.url)
        sent: list[httpx.Request] = []
        # the default retries (2); each try gives up before the job is done
        api = openai.AsyncOpenAI(
            base_url=f"{stack.url}/v1", api_key=key, timeout=3.0, http_client=counting(sent)
        )
        fake_comfy.pause()  # the GPU holds the job until the SDK has retried
        asking = asyncio.create_task(api.images.generate(model="f", prompt=PROMPT, size="256x256"))
        await until(lambda: len(sent) >= 2 or asking.done())
        assert not asking.done(), "the first try timed out and was retried"
        fake_comfy.resume()
        result = await asyncio.wait_for(asking, 60)
        data = base64.b64decode(result.data[0].b64_json or "")
        with Image.open(io.BytesIO(data)) as image:
            assert image.size == (256, 256)
        assert await statuses(stack) == ["succeeded"]  # one job, not one per try


async def test_a_client_that_gives_up_gets_its_waiting_job_cancelled_and_quota_back(
    db, fake_comfy
) -> None:
    limits = config.LimitsConfig(daily_quota=1, cooldown=0)
    async with (
        web_stack(db, [fake_comfy], api=FAST_GRACE, limits=limits, worker=False) as stack,
        client() as session,
    ):
        await sign_up(session, await stack.invite(), "ugo")
        api = openai.AsyncOpenAI(
            base_url=f"{stack.url}/v1",
            api_key=await make_key(session, stack.url),
            timeout=1.0,
            max_retries=0,
        )
        with pytest.raises(openai.APITimeoutError):
            await api.images.generate(model="f", prompt=PROMPT)
        cancelled = False

        async def given_up() -> bool:
            nonlocal cancelled
            cancelled = await statuses(stack) == ["cancelled"]
            return cancelled

        await wait_for(given_up, timeout=30)
        # the day's one job is free again: a new request is queued, not refused
        with pytest.raises(openai.APITimeoutError):
            await api.images.generate(model="f", prompt="another " + PROMPT)
        assert (await statuses(stack))[0] == "cancelled" and len(await statuses(stack)) == 2


async def test_a_started_job_is_kept_for_a_retry_and_two_live_requests_are_two(
    db, fake_comfy
) -> None:
    async with web_stack(db, [fake_comfy], api=FAST_GRACE) as stack, client() as session:
        await sign_up(session, await stack.invite(), "vic")
        key = await make_key(session, stack.url)
        impatient = openai.AsyncOpenAI(
            base_url=f"{stack.url}/v1", api_key=key, timeout=60.0, max_retries=0
        )
        fake_comfy.pause()  # on the GPU (claimed and sent), not finished
        first = asyncio.create_task(
            impatient.images.generate(model="f", prompt=PROMPT, size="256x256")
        )

        async def on_gpu_and_waited_for() -> bool:
            found = await stack.db.jobs.list_for_user(await _user(stack, "vic"))
            async with stack.db.pool.connection() as conn:
                cursor = await conn.execute("SELECT clients FROM api_requests")
                rows = [r["clients"] for r in await cursor.fetchall()]
            return bool(found) and found[0].submitted and rows == [1]

        # The client leaves once its job is on the GPU and its request is on record (a
        # timeout fixed in seconds raced the claim on a loaded machine: a job not yet
        # sent when the grace ends is given up instead, as it should be).
        await wait_for(on_gpu_and_waited_for, timeout=30)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        fake_comfy.resume()

        async def done() -> bool:
            return await statuses(stack) == ["succeeded"]

        await wait_for(done, timeout=30)

        async def kept() -> bool:  # past the grace: kept for a retry, not given up
            async with stack.db.pool.connection() as conn:
                cursor = await conn.execute("SELECT state FROM api_requests")
                return [r["state"] for r in await cursor.fetchall()] == ["kept"]

        await wait_for(kept, timeout=30)
        patient = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)
        again = await patient.images.generate(model="f", prompt=PROMPT, size="256x256")
        assert again.data[0].b64_json and await statuses(stack) == ["succeeded"]

        # handed out once: the same request now is a new one; and two at once are two
        both = await asyncio.gather(
            patient.images.generate(model="f", prompt=PROMPT, size="256x256"),
            patient.images.generate(model="f", prompt=PROMPT, size="256x256"),
        )
        assert all(r.data[0].b64_json for r in both)
        assert await statuses(stack) == ["succeeded"] * 3


@pytest.mark.parametrize("unseen", ["until_done", "until_written"])
async def test_a_client_that_leaves_as_its_job_ends_leaves_it_to_its_retry(
    db, fake_comfy, monkeypatch, unseen: str
) -> None:
    """The client leaves just before its job ends, and the server learns it only when the
    job is done ("until_done": between two looks at the connection) or not before the
    answer is written ("until_written"): the answer reached nobody, so the retry gets
    that job's image and nothing is queued again."""
    seen: list = []
    look = retries.connected

    def looked(request) -> bool:
        seen.append(request)
        return True if unseen == "until_written" else look(request)

    monkeypatch.setattr(retries, "connected", looked)
    monkeypatch.setattr(retries, "WATCH", 600.0)  # no look between the first and the end
    async with web_stack(db, [fake_comfy], api=FAST_GRACE) as stack, client() as session:
        await sign_up(session, await stack.invite(), "wes")
        key = await make_key(session, stack.url)
        api = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)
        fake_comfy.pause()
        first = asyncio.create_task(api.images.generate(model="f", prompt=PROMPT, size="256x256"))

        async def on_gpu_and_waited_for() -> bool:
            found = await stack.db.jobs.list_for_user(await _user(stack, "wes"))
            async with stack.db.pool.connection() as conn:
                cursor = await conn.execute("SELECT clients FROM api_requests")
                rows = [r["clients"] for r in await cursor.fetchall()]
            return bool(found) and found[0].submitted and rows == [1] and bool(seen)

        await wait_for(on_gpu_and_waited_for, timeout=30)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await until(lambda: not look(seen[0]))  # the server's side of it is closed
        fake_comfy.resume()

        async def left() -> bool:  # the job done, its request left to a retry
            async with stack.db.pool.connection() as conn:
                cursor = await conn.execute("SELECT clients FROM api_requests")
                rows = [r["clients"] for r in await cursor.fetchall()]
            return await statuses(stack) == ["succeeded"] and rows == [0]

        await wait_for(left, timeout=30)
        again = await api.images.generate(model="f", prompt=PROMPT, size="256x256")
        assert again.data[0].b64_json and await statuses(stack) == ["succeeded"]


async def test_a_retry_sent_before_its_first_try_noticed_its_client_left_takes_it_over(
    db, fake_comfy, monkeypatch
) -> None:
    """The first try looks at its connection only now and then: a retry sent in between
    (its client gone, the leave not yet noted) takes the first try's job over; a live
    identical request still is a request of its own."""
    seen: list = []
    look = retries.connected

    def looked(request) -> bool:
        seen.append(request)
        return look(request)

    monkeypatch.setattr(retries, "connected", looked)
    monkeypatch.setattr(retries, "WATCH", 600.0)  # the first try looks once, then at the end
    async with web_stack(db, [fake_comfy], api=FAST_GRACE) as stack, client() as session:
        await sign_up(session, await stack.invite(), "rex")
        key = await make_key(session, stack.url)
        api = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)
        fake_comfy.pause()
        first = asyncio.create_task(api.images.generate(model="f", prompt=PROMPT, size="256x256"))

        async def waited_for() -> bool:
            async with stack.db.pool.connection() as conn:
                cursor = await conn.execute("SELECT clients FROM api_requests")
                rows = [r["clients"] for r in await cursor.fetchall()]
            return rows == [1] and bool(seen)

        await wait_for(waited_for, timeout=30)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await until(lambda: not look(seen[0]))  # gone, and the first try has not looked
        retry = asyncio.create_task(api.images.generate(model="f", prompt=PROMPT, size="256x256"))

        async def taken_over() -> bool:
            async with stack.db.pool.connection() as conn:
                cursor = await conn.execute("SELECT clients, attached FROM api_requests")
                rows = [(r["clients"], r["attached"]) for r in await cursor.fetchall()]
            return rows == [(1, 1)] or len(await statuses(stack)) > 1

        await wait_for(taken_over, timeout=30)
        fake_comfy.resume()
        again = await retry
        assert await statuses(stack) == ["succeeded"]  # one job, not two
        assert again.data[0].b64_json


async def test_a_retry_waits_for_the_sweep_that_holds_its_request(db, fake_comfy) -> None:
    """The sweep locks a left request's row while it decides to keep it (its job is on
    the GPU); a retry arriving at that moment waits for the row instead of passing it by
    and queueing a second job."""
    slow_sweep = config.ApiConfig(retry_grace=300.0, retry_keep=300.0)
    async with web_stack(db, [fake_comfy], api=slow_sweep) as stack, client() as session:
        await sign_up(session, await stack.invite(), "sam")
        key = await make_key(session, stack.url)
        api = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)
        fake_comfy.pause()
        first = asyncio.create_task(api.images.generate(model="f", prompt=PROMPT, size="256x256"))

        async def clients() -> list[int]:
            async with stack.db.pool.connection() as conn:
                cursor = await conn.execute("SELECT clients FROM api_requests")
                return [r["clients"] for r in await cursor.fetchall()]

        async def on_gpu_and_waited_for() -> bool:
            found = await stack.db.jobs.list_for_user(await _user(stack, "sam"))
            return bool(found) and found[0].submitted and await clients() == [1]

        await wait_for(on_gpu_and_waited_for, timeout=30)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first

        async def left() -> bool:
            return await clients() == [0]

        await wait_for(left, timeout=30)
        async with stack.db.pool.connection() as sweep, sweep.transaction():
            await sweep.execute("SELECT id FROM api_requests FOR UPDATE")  # as `settle` does
            retry = asyncio.create_task(
                api.images.generate(model="f", prompt=PROMPT, size="256x256")
            )

            async def waiting_or_queued() -> bool:
                async with stack.db.pool.connection() as conn:
                    cursor = await conn.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE 'UPDATE api_requests%'"
                    )
                    waiting = bool(await cursor.fetchall())
                return waiting or len(await statuses(stack)) > 1

            await wait_for(waiting_or_queued, timeout=30)
            await sweep.execute("UPDATE api_requests SET state = 'kept'")
        fake_comfy.resume()
        again = await retry
        assert await statuses(stack) == ["succeeded"]  # one job, not two
        assert again.data[0].b64_json


async def _user(stack, name: str) -> int:
    account = await stack.store.account_by_name(name)
    assert account is not None
    return account.user_id
