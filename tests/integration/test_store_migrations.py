"""Migrations, `comfyveil db`, and opening the database (URL or embedded server)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest

from comfyveil import config
from comfyveil.cli import db as db_cli
from comfyveil.store import database, embedded, errors, sql
from tests.fixtures.database import open_for_the_database_user

EXPECTED_TABLES = {
    "users", "commands", "jobs", "job_inputs", "job_outputs", "job_events", "deliveries",
    "chat_sessions", "queue_turns", "schema_migrations", "delivery_claims",
    "user_usage", "workflow_versions", "backend_traces",
    "web_accounts", "web_invites", "web_sessions", "web_links", "policy_refusals",
    "worker_heartbeats", "web_api_keys", "web_secrets", "web_login_failures", "server_starts",
    "api_requests", "job_previews",
    "web_webhooks", "webhook_deliveries", "webhook_jobs",
    "backend_model_lists",
}


async def _tables(url: str) -> set[str]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        )
        return {row[0] for row in await cursor.fetchall()}


async def test_migrations_apply_to_an_empty_database_once(empty_database_url: str) -> None:
    newest = sql.migrations()[-1][0]
    conns = [await database.connect(empty_database_url) for _ in range(3)]
    try:
        before = await database.migration_status(conns[0])
        assert before.current is None and [v for v, _ in before.pending][-1] == newest
        # several processes starting at once: one migrates, the others find it done
        results = await asyncio.gather(*(database.migrate(c) for c in conns))
        assert sorted(len(r) for r in results) == [0, 0, len(sql.migrations())]
        after = await database.migration_status(conns[0])
        assert after.current == newest and after.pending == ()
    finally:
        for conn in conns:
            await conn.close()
    assert await _tables(empty_database_url) == EXPECTED_TABLES


async def test_db_status_and_migrate_commands(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    args = argparse.Namespace(config=None)

    assert await db_cli.status(args) == 0
    out = capsys.readouterr().out
    assert "schema version: none (empty database)" in out
    assert "0001_initial" in out and "comfyveil db migrate" in out

    assert await db_cli.migrate(args) == 0
    out = capsys.readouterr().out
    assert "applied migration 0001" in out

    assert await db_cli.status(args) == 0
    out = capsys.readouterr().out
    assert f"schema version: {sql.migrations()[-1][0]}" in out
    assert "pending migrations: none" in out


async def test_unreachable_database_is_one_plain_sentence(tmp_path: Path) -> None:
    url = f"postgresql://nobody@/nothing?host={tmp_path}&connect_timeout=2"
    with pytest.raises(errors.DatabaseUnreachable) as caught:
        await database.Database.open(url=url)
    message = str(caught.value)
    assert message.startswith("the database is unreachable: ")
    assert "\n" not in message and "Traceback" not in message


async def test_open_without_url_starts_and_stops_the_embedded_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = Path(tempfile.mkdtemp(prefix="comfyveil-embedded-"))
    open_for_the_database_user(root / "pg")
    try:
        settings = config.Settings(
            data_dir=root, database=config.DatabaseConfig(url=None, data_dir=root / "pg")
        )
        db = await database.Database.open(settings)
        async with db:
            status = await db.migration_status()
            assert status.current == sql.migrations()[-1][0]
            user = await db.users.get_or_create(42)
            assert user.role == "user"
        assert not (root / "pg" / "postmaster.pid").exists()  # stopped on close
        # a second start finds the data again
        async with await database.Database.open(settings) as again:
            assert await again.users.get(42) is not None
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root only")
async def test_as_root_the_embedded_server_opens_no_private_directory() -> None:
    root = Path(tempfile.mkdtemp(prefix="comfyveil-private-"))  # 0700, like /root
    try:
        with pytest.raises(errors.EmbeddedServerError, match=str(root)) as raised:
            await embedded.EmbeddedServer(root / "data" / "pg").start()
        assert "DATABASE_URL" in str(raised.value)
        assert root.stat().st_mode & 0o777 == 0o700  # left as it was
        assert not (root / "data" / "pg").exists()
        # Open, but so deep that the socket would move to a shared 0777 directory.
        open_for_the_database_user(root / "x")
        deep = root / ("d" * 60) / ("e" * 60)
        deep.mkdir(parents=True, mode=0o755)
        with pytest.raises(errors.EmbeddedServerError, match="too long"):
            await embedded.EmbeddedServer(deep / "pg").start()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root only")
async def test_as_root_the_embedded_server_has_no_secret_and_no_root_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "hf_" + "Zq7" * 12
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("COMFYVEIL_TELEGRAM_TOKEN", "123456789:" + "A" * 35)
    root = Path(tempfile.mkdtemp(prefix="comfyveil-embedded-"))
    open_for_the_database_user(root / "pg")
    server = embedded.EmbeddedServer(root / "pg")
    try:
        await server.start()
        pid = int((root / "pg" / "postmaster.pid").read_text().split()[0])
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        names = {entry.split(b"=", 1)[0].decode() for entry in environ.split(b"\0") if entry}
        assert secret.encode() not in environ and b"AAAAAAAAAA" not in environ
        assert names <= {"PATH", "PGDATA", *embedded.KEPT_ENVIRONMENT} | {
            "PG_GRANDPARENT_PID",  # pg_ctl's own, for the server
            "PGLOCALEDIR", "PGSYSCONFDIR", "PWD",
        }, names
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        assert "0" not in status["Uid"].split() and "0" not in status["Gid"].split(), status
        assert "0" not in status["Groups"].split(), status
    finally:
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)
