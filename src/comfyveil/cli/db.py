"""`comfyveil db`: the database schema.

    comfyveil db migrate     apply pending migrations (the bot and workers also do at start)
    comfyveil db status      show the schema version and the migrations still pending

With no DATABASE_URL (or [database] url) the embedded PostgreSQL in the data directory is
started for the command and stopped afterwards.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import psycopg

from comfyveil import cli, config_load
from comfyveil.store import database, embedded


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "db", help=cli.SUBCOMMANDS["db"],
        description="Manage comfyveil's PostgreSQL schema.",
    )
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    for name, handler, text in (
        ("migrate", migrate, "apply pending migrations"),
        ("status", status, "show the schema version and pending migrations"),
    ):
        action = actions.add_parser(name, help=text, description=text.capitalize() + ".")
        action.add_argument(
            "--config", type=Path, default=None, metavar="FILE",
            help="settings file (default: COMFYVEIL_CONFIG, else ./comfyveil.toml)",
        )
        action.set_defaults(handler=handler)


def describe(url: str, server: embedded.EmbeddedServer | None) -> str:
    """Where the database is, without the password."""
    if server is not None:
        return f"embedded PostgreSQL in {server.data_dir}"
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the configured database (its URL could not be parsed)"
    host = info.get("host") or "localhost"
    port = f":{info['port']}" if info.get("port") else ""
    return f"database {info.get('dbname') or '(default)'} on {host}{port}"


async def _with_connection(args: argparse.Namespace, action: str) -> int:
    settings = config_load.load(args.config)
    url, server = await database.Database.resolve_url(settings)
    try:
        conn = await database.connect(url)
        try:
            print(describe(url, server))
            if action == "migrate":
                applied = await database.migrate(conn)
                for version in applied:
                    print(f"applied migration {version}")
            state = await database.migration_status(conn)
        finally:
            await conn.close()
    finally:
        if server is not None:
            await server.stop()
    print(f"schema version: {state.current or 'none (empty database)'}")
    if state.pending:
        names = ", ".join(f"{v}_{n}" for v, n in state.pending)
        print(f"pending migrations: {names} (run: comfyveil db migrate)")
    else:
        print("pending migrations: none")
    return 0


async def migrate(args: argparse.Namespace) -> int:
    """Apply pending migrations."""
    return await _with_connection(args, "migrate")


async def status(args: argparse.Namespace) -> int:
    """Print the schema version and pending migrations."""
    return await _with_connection(args, "status")
