"""The database blinking under a waiting images request (a restart, a crash recovery):
the request whose job is queued waits through it and gets its image; and one that ends
with an error after queueing has its leave on record, so its retry takes its job over
instead of paying for a second one."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from comfyveil.api import retries
from comfyveil.store import api_requests, database, job_store
from comfyveil.store import errors as store_errors
from tests.api.test_api_openai import PROMPT, make_key
from tests.api.test_api_retries import openai, statuses
from tests.integration.test_worker_recovery import _start_again, restartable_pg  # noqa: F401
from tests.web.support import client, sign_up, wait_for, web_stack


def unreachable() -> store_errors.DatabaseUnreachable:
    return store_errors.DatabaseUnreachable("the database is unreachable: server closed")


def down_for(monkeypatch: pytest.MonkeyPatch, cls: type, name: str, times: list[int]) -> None:
    """`cls.name` raises the store's database-unreachable error while `times[0]` > 0
    (each call counts one down)."""
    real = getattr(cls, name)

    async def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        if times[0] > 0:
            times[0] -= 1
            raise unreachable()
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, flaky)


async def test_a_queued_request_waits_through_a_database_blink_and_gets_its_image(
    db, fake_comfy, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "bea")
        api = openai.AsyncOpenAI(
            base_url=f"{stack.url}/v1", api_key=await make_key(session, stack.url), max_retries=0
        )
        down = [4]  # the reads of its finished job fail a few times: about 1.5 s
        down_for(monkeypatch, job_store.JobStore, "outputs", down)
        result = await asyncio.wait_for(
            api.images.generate(model="f", prompt=PROMPT, size="256x256"), 60
        )
        assert down == [0], "the request met the outage"
        assert base64.b64decode(result.data[0].b64_json or "")  # its image, no 503
        assert await statuses(stack) == ["succeeded"]


async def test_a_retry_after_an_error_past_queueing_takes_the_job_over(
    db, fake_comfy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        retries, "OUTAGE", 0.3, raising=False
    )  # an outage longer than a request waits
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "cal")
        api = openai.AsyncOpenAI(
            base_url=f"{stack.url}/v1", api_key=await make_key(session, stack.url), max_retries=0
        )
        reads = [10_000]  # down for the first try's wait, until its leave has failed too
        leaves = [3]  # and down for its first leaves
        down_for(monkeypatch, job_store.JobStore, "outputs", reads)
        real_leave = api_requests.ApiRequestStore.leave

        async def leave(self: Any, request_id: int, *, handed: bool) -> None:
            if leaves[0] > 0:
                leaves[0] -= 1
                reads[0] = 0  # the database is back once this first leave has failed
                raise unreachable()
            await real_leave(self, request_id, handed=handed)

        monkeypatch.setattr(api_requests.ApiRequestStore, "leave", leave)
        with pytest.raises(openai.InternalServerError) as told:
            await asyncio.wait_for(api.images.generate(model="f", prompt=PROMPT), 60)
        assert told.value.status_code == 503
        assert await statuses(stack) == ["succeeded"]
        # the SDK's retry, same body: the first try's job, not a second one
        result = await asyncio.wait_for(api.images.generate(model="f", prompt=PROMPT), 60)
        assert base64.b64decode(result.data[0].b64_json or "")
        assert await statuses(stack) == ["succeeded"]  # one job, paid once


async def test_a_retry_in_the_same_process_takes_over_while_the_leave_is_still_unwritten(
    db, fake_comfy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retries, "OUTAGE", 0.3, raising=False)
    monkeypatch.setattr(retries, "LEAVE_WAIT", 1.0, raising=False)
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "eve")
        api = openai.AsyncOpenAI(
            base_url=f"{stack.url}/v1", api_key=await make_key(session, stack.url), max_retries=0
        )
        reads = [10_000]
        down_for(monkeypatch, job_store.JobStore, "outputs", reads)
        leaving = [True]  # the first try's leave cannot be written until the retry comes
        real_leave = api_requests.ApiRequestStore.leave

        async def leave(self: Any, request_id: int, *, handed: bool) -> None:
            if leaving[0]:
                raise unreachable()
            await real_leave(self, request_id, handed=handed)

        monkeypatch.setattr(api_requests.ApiRequestStore, "leave", leave)
        with pytest.raises(openai.InternalServerError):
            await asyncio.wait_for(api.images.generate(model="f", prompt=PROMPT), 60)
        async with stack.db.pool.connection() as conn:
            cursor = await conn.execute("SELECT clients FROM api_requests")
            assert [r["clients"] for r in await cursor.fetchall()] == [1], "still unwritten"
        reads[0] = 0
        leaving[0] = False  # the database is back as the retry arrives
        result = await asyncio.wait_for(api.images.generate(model="f", prompt=PROMPT), 60)
        assert base64.b64decode(result.data[0].b64_json or "")
        assert await statuses(stack) == ["succeeded"]  # one job, paid once


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_queued_request_waits_through_a_real_database_restart(
    restartable_pg: Any,  # noqa: F811
    fake_comfy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pgserver import _commands

    # The pool waits this long for a connection: an outage past it reaches the request
    # (10 s by default; shortened so a short outage shows what a long one does).
    monkeypatch.setattr(database, "CONNECT_TIMEOUT", 1)

    url = restartable_pg.get_uri()
    conn = await database.connect(url)
    try:
        await database.migrate(conn)
    finally:
        await conn.close()
    db = await database.Database.open(url=url, run_migrations=False, max_size=4)
    try:
        async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
            await sign_up(session, await stack.invite(), "dan")
            api = openai.AsyncOpenAI(
                base_url=f"{stack.url}/v1",
                api_key=await make_key(session, stack.url),
                max_retries=0,
            )
            fake_comfy.pause()  # on the GPU while the database is down
            asking = asyncio.create_task(
                api.images.generate(model="f", prompt=PROMPT, size="256x256")
            )

            async def on_gpu_and_waited_for() -> bool:
                async with stack.db.pool.connection() as c:
                    cursor = await c.execute(
                        "SELECT (SELECT bool_and(submitted) FROM jobs) AS sent, "
                        "(SELECT count(*) FROM api_requests) AS rows"
                    )
                    row = await cursor.fetchone()
                return row is not None and bool(row["sent"]) and row["rows"] == 1

            await wait_for(on_gpu_and_waited_for, timeout=30)
            await asyncio.to_thread(
                _commands.pg_ctl,
                ["-w", "-m", "fast", "stop"],
                pgdata=restartable_pg.pgdata,
                user=restartable_pg.system_user,
            )
            # Down past the waiter's fallback read (2 s) and the pool's wait: the request
            # reads its job meanwhile, and the read fails.
            await asyncio.sleep(4.0)
            assert not asking.done(), "a request whose job is queued waits through it"
            await asyncio.to_thread(_start_again, restartable_pg)
            fake_comfy.resume()
            result = await asyncio.wait_for(asking, 60)
            assert base64.b64decode(result.data[0].b64_json or "")
            assert await statuses(stack) == ["succeeded"]
    finally:
        await db.close()
