"""Users, chat sessions and commands on a real PostgreSQL."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from comfyveil.comfy import workflow
from comfyveil.errors import UsageError
from comfyveil.store import commands, database, errors, jobs, sessions

Database = database.Database


async def test_get_or_create_keeps_an_existing_role(db: Database) -> None:
    created = await db.users.get_or_create(5)
    assert created.role == "user" and created.settings == {}
    await db.users.set_role(5, "banned")
    again = await db.users.get_or_create(5, role="admin")
    assert again.role == "banned"
    with pytest.raises(UsageError):
        await db.users.set_role(5, "root")  # type: ignore[arg-type]


async def test_settings_merge_and_remove(db: Database) -> None:
    assert await db.users.settings(9) == {}
    await db.users.update_settings(9, {"steps": 4, "seed": 1})
    result = await db.users.update_settings(9, {"steps": 8}, remove=["seed"])
    assert result == {"steps": 8}
    assert await db.users.settings(9) == {"steps": 8}


async def _finished_job(db: Database, user: int, chat: int) -> jobs.Job:
    await db.jobs.enqueue(
        jobs.NewJob(user_id=user, chat_id=chat, command="f", workflow_hash="h",
                    inputs=[jobs.InputImage("in.png", "image/png", b"in")])
    )
    claimed = await db.jobs.claim("w")
    assert claimed is not None
    done = await db.jobs.complete(claimed, [jobs.Output("o.png", "image", "image/png", b"out")])
    await db.jobs.record_delivery(done.id, "telegram")
    return done


async def _count(url: str, table: str, user: int) -> int:
    column = {"jobs": "user_id", "chat_sessions": "user_id", "users": "id",
              "queue_turns": "user_id"}
    async with await psycopg.AsyncConnection.connect(url) as conn:
        if table in column:
            query = f"SELECT count(*) FROM {table} WHERE {column[table]} = %s"
        else:
            query = (f"SELECT count(*) FROM {table} t JOIN jobs j ON j.id = t.job_id "
                     "WHERE j.user_id = %s")
        cursor = await conn.execute(query, (user,))
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


async def test_forget_user_removes_everything_about_them(db: Database) -> None:
    await db.users.update_settings(1, {"steps": 8})
    await _finished_job(db, 1, 1)
    await _finished_job(db, 1, -500)  # in a group chat
    await db.jobs.enqueue(jobs.NewJob(user_id=1, chat_id=1, command="f", workflow_hash="h"))
    kept = await _finished_job(db, 2, -500)

    assert await db.users.forget(1) == 3

    for table in ("jobs", "job_outputs", "job_events", "deliveries", "chat_sessions", "users",
                  "queue_turns", "job_inputs"):
        assert await _count(db.url, table, 1) == 0, table
    assert await db.users.get(1) is None
    # what the limits count stays, with no content: forgetting is no way round a quota
    assert await db.users.quota_used_today(1) == 3
    # the other user's result in the shared chat stays
    session = await db.sessions.last_outputs(-500)
    assert session is not None and session.job_id == kept.id
    assert len(await db.jobs.outputs(kept.id)) == 1


async def test_chat_session_set_and_clear(db: Database) -> None:
    done = await _finished_job(db, 3, 3)
    ref = sessions.OutputRef(index=0, filename="o.png", kind="image", mime="image/png")
    stored = await db.sessions.set_last_outputs(77, 3, done.id, [ref])
    assert stored.outputs == (ref,)
    assert await db.sessions.last_outputs(77) == stored
    assert await db.sessions.clear(77) is True
    assert await db.sessions.last_outputs(77) is None


async def test_seed_shipped_commands_keeps_the_operators_choices(db: Database) -> None:
    shipped = workflow.shipped()
    assert await db.commands.seed() == len(shipped)
    listed = await db.commands.list()
    assert {c.command for c in listed} == {w.command for w in shipped.values()}
    assert all(c.source == "shipped" and c.enabled for c in listed)

    first = listed[0]
    await db.commands.set_enabled("/" + first.command, False)
    assert await db.commands.seed() == 0  # nothing changed, nothing rewritten
    assert (await db.commands.get(first.command)).enabled is False  # type: ignore[union-attr]
    assert first.command not in {c.command for c in await db.commands.list(enabled_only=True)}

    # the stored texts give back the same workflow
    original = shipped[first.workflow]
    assert first.to_workflow().hash == original.hash == first.hash


async def test_operator_command_wins_over_a_shipped_one(db: Database) -> None:
    await db.commands.seed()
    wf = next(iter(workflow.shipped().values()))
    assert wf.source is not None
    toml_text = wf.source.read_text()
    graph_text = wf.source.with_suffix(".json").read_text()
    added = await db.commands.add(wf, toml_text, graph_text, allowed_roles=["admin"],
                                  limits={"max_steps": 10})
    assert added.source == "operator" and added.limits == {"max_steps": 10}
    assert not added.allows("user") and added.allows("admin")
    await db.commands.seed()
    assert (await db.commands.get(wf.command)).source == "operator"  # type: ignore[union-attr]
    with pytest.raises(commands.CommandNotFound):
        await db.commands.set_enabled("nope", True)


async def test_forget_keeps_the_limits_and_an_admins_decisions(db: Database) -> None:
    """"Queue three, /forget, repeat" used to reset every limit of a user."""
    for _ in range(3):
        await db.jobs.enqueue(jobs.NewJob(user_id=7, chat_id=7, command="f", workflow_hash="h"),
                              max_active=3, daily_quota=3)
    with pytest.raises(errors.QueueLimitReached):
        await db.jobs.enqueue(jobs.NewJob(user_id=7, chat_id=7, command="f",
                                          workflow_hash="h"), max_active=3, daily_quota=3)
    assert await db.users.forget(7) == 3
    assert await _count(db.url, "jobs", 7) == 0
    with pytest.raises(errors.DailyQuotaReached):
        await db.jobs.enqueue(jobs.NewJob(user_id=7, chat_id=7, command="f",
                                          workflow_hash="h"), max_active=3, daily_quota=3)
    await db.jobs.enqueue(jobs.NewJob(user_id=8, chat_id=8, command="f", workflow_hash="h"),
                          cooldown=60)
    await db.users.forget(8)
    with pytest.raises(errors.CoolingDown):
        await db.jobs.enqueue(jobs.NewJob(user_id=8, chat_id=8, command="f",
                                          workflow_hash="h"), cooldown=60)

    await db.users.update_settings(9, {"steps": 8, "allowed": True})
    await db.users.set_daily_quota(9, 2)
    await db.users.set_role(10, "banned")
    await db.users.update_settings(10, {"ar": "16:9"})
    await db.users.update_settings(11, {"ar": "16:9"})
    for user in (9, 10, 11):
        await db.users.forget(user)
    kept = await db.users.get(9)
    assert kept is not None and kept.daily_quota == 2 and kept.settings == {"allowed": True}
    banned = await db.users.get(10)
    assert banned is not None and banned.role == "banned" and banned.settings == {}
    assert await db.users.get(11) is None  # nothing an admin decided: no row at all
    async with await psycopg.AsyncConnection.connect(db.url) as conn:
        cursor = await conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'user_usage' ORDER BY ordinal_position"
        )
        assert [r[0] for r in await cursor.fetchall()] == [
            "user_id", "day", "jobs_today", "last_job_at"]


async def test_forget_stops_a_running_job_and_strips_it(db: Database) -> None:
    job = await db.jobs.enqueue(jobs.NewJob(
        user_id=12, chat_id=12, command="f", workflow_hash="h",
        params={"prompt": "a secret"}, idempotency_key="tg:12:1",
        inputs=[jobs.InputImage("in.png", "image/png", b"in")]))
    claimed = await db.jobs.claim("w")
    assert claimed is not None and claimed.id == job.id
    assert await db.users.forget(12) == 1
    stopping = await db.jobs.get(job.id)
    assert stopping is not None
    assert stopping.status is jobs.Status.RUNNING and stopping.cancel_requested
    assert stopping.params == {} and stopping.idempotency_key is None
    assert await db.jobs.inputs(job.id) == []
    assert [e.kind for e in await db.jobs.events(job.id)] == ["cancel_requested"]
    cancelled = await db.jobs.mark_cancelled(claimed)
    assert cancelled.status is jobs.Status.CANCELLED


async def test_concurrent_enqueues_within_the_cooldown_admit_exactly_one(db: Database) -> None:
    async def one(n: int) -> jobs.Job | None:
        try:
            return await db.jobs.enqueue(
                jobs.NewJob(user_id=13, chat_id=13, command="f", workflow_hash="h",
                            idempotency_key=f"tg:13:{n}"),
                max_active=10, daily_quota=100, cooldown=30)
        except errors.CoolingDown as exc:
            assert 1 <= exc.seconds <= 30
            return None

    results = await asyncio.gather(*(one(n) for n in range(8)))
    assert sum(r is not None for r in results) == 1
    assert await _count(db.url, "jobs", 13) == 1
    with pytest.raises(errors.CoolingDown):
        await db.jobs.check_limits(13, cooldown=30)
    await db.jobs.check_limits(13, cooldown=None)  # no cooldown: nothing to refuse
    await db.jobs.check_limits(14, cooldown=30)  # another user


async def test_the_daily_count_starts_again_on_a_new_utc_day(db: Database) -> None:
    for _ in range(2):
        await db.jobs.enqueue(jobs.NewJob(user_id=15, chat_id=15, command="f",
                                          workflow_hash="h"), daily_quota=2)
    with pytest.raises(errors.DailyQuotaReached):
        await db.jobs.check_limits(15, daily_quota=2)
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        await conn.execute("UPDATE user_usage SET day = day - 1 WHERE user_id = 15")
    assert await db.users.quota_used_today(15) == 0
    await db.jobs.check_limits(15, daily_quota=2)
    await db.jobs.enqueue(jobs.NewJob(user_id=15, chat_id=15, command="f", workflow_hash="h"),
                          daily_quota=2)
    assert await db.users.quota_used_today(15) == 1
