"""Which process's client waits on an images API request, at the store: a request whose
process died (its presence lock gone with its connection) is left at once, for a retry
on another process to take over or, after the grace period, for the sweep to give up; a
request whose process lives is its own, even while that process takes its lock again."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import psycopg

from comfyveil.store import api_requests, database, jobs, presence
from tests.api.test_api_requests_store import account, new_job, used_today
from tests.api.test_api_retries_killed import settled
from tests.web.support import wait_for


async def hold(db: database.Database, key: int) -> psycopg.AsyncConnection[Any]:
    """A process's presence lock, on a connection of its own."""
    conn = await database.connect(db.url)
    await conn.execute("SELECT pg_advisory_lock(%(k)s)", {"k": key})
    return conn


async def kill(db: database.Database, conn: psycopg.AsyncConnection[Any], key: int) -> None:
    """The connection's process is killed: its socket closes without a word (no
    Terminate message, no unlock), and the server drops the session and its lock."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    with contextlib.suppress(Exception):
        await conn.close()

    async def gone() -> bool:
        return not await held(db, key)

    await wait_for(gone, timeout=10, interval=0.02)


async def held(db: database.Database, key: int) -> list[int]:
    """The server processes holding the lock on `key`."""
    async with db.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND granted AND classid = (%(k)s >> 32)::oid AND objid = (%(k)s & 4294967295)::oid",
            {"k": key},
        )
        return [r["pid"] for r in await cursor.fetchall()]


async def row(db: database.Database, request_id: int) -> dict[str, Any] | None:
    async with db.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT clients, attached, owner, state, left_at FROM api_requests WHERE id = %(i)s",
            {"i": request_id},
        )
        return await cursor.fetchone()


async def test_a_dead_processs_requests_are_left_at_once_and_a_live_ones_are_its_own(
    db: database.Database,
) -> None:
    await settled(db)
    owner = await account(db, "ada")
    first_key, retry_key = presence.new_key(), presence.new_key()
    first_lock, retry_lock = await hold(db, first_key), await hold(db, retry_key)
    first = api_requests.ApiRequestStore(db.pool, owner=first_key)
    retry = api_requests.ApiRequestStore(db.pool, owner=retry_key)
    try:
        # the first process waits on two requests (one on the GPU, one still queued)
        sent = await db.jobs.enqueue(new_job(owner.user_id), daily_quota=10)
        claimed = await db.jobs.claim("worker-test")
        assert claimed is not None and claimed.id == sent.id
        await db.jobs.mark_submitted(claimed, "gpu0")
        queued = await db.jobs.enqueue(new_job(owner.user_id), daily_quota=10)
        on_gpu = await first.open(owner.id, b"on-gpu", [sent.id])
        waiting = await first.open(owner.id, b"waiting", [queued.id])

        # alive: an identical request on another process is a request of its own
        assert await retry.take_over(owner.id, b"on-gpu") is None
        assert not await retry.has_abandoned(owner.id)
        assert await retry.settle(grace=0.0, keep=300.0) == []

        await kill(db, first_lock, first_key)  # SIGKILL: no leave is ever noted
        assert await retry.has_abandoned(owner.id)  # its retry passes the limits
        taken = await retry.take_over(owner.id, b"on-gpu")
        assert taken is not None and taken.id == on_gpu and taken.job_ids == (sent.id,)
        now = await row(db, on_gpu)
        assert now is not None and (now["clients"], now["owner"]) == (1, retry_key)
        # the retry's process lives: its request is not taken again
        assert (
            await api_requests.ApiRequestStore(db.pool, owner=1).take_over(owner.id, b"on-gpu")
            is None
        )
        # a leave the dead process might still send frees nothing of the retry's
        await first.leave(on_gpu, handed=False)
        await first.leave(on_gpu, handed=True)
        now = await row(db, on_gpu)
        assert now is not None and now["clients"] == 1

        # the other request, nobody's now, is given up after the grace period, counted
        # from when a sweep first saw its owner dead: its queued job cancelled, quota back
        assert await retry.settle(grace=60.0, keep=300.0) == []
        seen = await row(db, waiting)
        assert seen is not None and seen["left_at"] is not None
        stopped = await retry.settle(grace=0.0, keep=300.0)
        assert [j.id for j in stopped] == [queued.id]
        assert (await db.jobs.get(queued.id)).status is jobs.Status.CANCELLED
        assert await used_today(db, owner.user_id) == 1
        assert await row(db, waiting) is None
        assert await row(db, on_gpu) is not None  # the live retry's, untouched
    finally:
        for conn in (first_lock, retry_lock):
            with contextlib.suppress(Exception):
                await conn.close()


async def test_a_process_that_takes_its_lock_again_keeps_its_waiting_requests(
    db: database.Database,
) -> None:
    """Its connection lost (a database restart, a broken network), a live process counts
    as dead until it has its lock again; a sweep meanwhile only notes it, and forgets
    that note once the lock is back: its queued job is not given up."""
    await settled(db)
    owner = await account(db, "bea")
    key = presence.new_key()
    lock = await hold(db, key)
    mine = api_requests.ApiRequestStore(db.pool, owner=key)
    sweep = api_requests.ApiRequestStore(db.pool, owner=presence.new_key())
    queued = await db.jobs.enqueue(new_job(owner.user_id), daily_quota=10)
    request_id = await mine.open(owner.id, b"waiting", [queued.id])
    await kill(db, lock, key)
    assert await sweep.settle(grace=60.0, keep=300.0) == []  # seen dead
    seen = await row(db, request_id)
    assert seen is not None and seen["left_at"] is not None
    lock = await hold(db, key)  # back
    try:
        assert await sweep.settle(grace=0.0, keep=300.0) == []
        assert await sweep.settle(grace=0.0, keep=300.0) == []
        now = await row(db, request_id)
        assert now is not None and now["clients"] == 1 and now["left_at"] is None
        assert (await db.jobs.get(queued.id)).status is jobs.Status.QUEUED
        assert await sweep.take_over(owner.id, b"waiting") is None
    finally:
        await lock.close()


async def test_just_after_the_database_starts_no_owner_counts_as_dead(
    db: database.Database,
) -> None:
    """Every lock is gone when the database starts, until each process takes its own
    again: meanwhile a retry does not take a live process's request."""
    owner = await account(db, "cy")
    key = presence.new_key()
    queued = await db.jobs.enqueue(new_job(owner.user_id), daily_quota=10)
    await api_requests.ApiRequestStore(db.pool, owner=key).open(owner.id, b"r", [queued.id])
    retry = api_requests.ApiRequestStore(db.pool, owner=presence.new_key())
    retry.settle_in = 10.0**9  # the database started "just now", for as long as it runs
    assert await retry.take_over(owner.id, b"r") is None
    assert not await retry.has_abandoned(owner.id)
    retry.settle_in = 0.0
    assert await retry.take_over(owner.id, b"r") is not None  # its owner never held a lock


async def test_a_process_takes_its_presence_lock_again_after_losing_its_connection(
    db: database.Database,
) -> None:
    here = presence.Presence(db.url)
    await here.start()
    try:
        (pid,) = await held(db, here.key)
        async with db.pool.connection() as conn:  # as a database restart ends each session
            await conn.execute("SELECT pg_terminate_backend(%(p)s)", {"p": pid})

        async def again() -> bool:
            pids = await held(db, here.key)
            return bool(pids) and pids != [pid]

        await wait_for(again, timeout=10, interval=0.02)
        assert here.held.is_set()
    finally:
        await here.close()
    assert await held(db, here.key) == []  # a stopping process lets it go
