"""Users, chat sessions and commands on a real PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest

from comfyveil.comfy import workflow
from comfyveil.errors import UsageError
from comfyveil.store import commands, database, jobs, sessions

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
    assert await db.users.quota_used_today(1) == 0
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
