"""`comfyveil status`: one table of what an operator checks first: the database, every
backend (up, its queue, what each command misses there) and every worker (alive or gone).

    comfyveil status --config comfyveil.toml

Exit 0 when the database answers, a backend is up and a worker is alive; 1 otherwise,
so a script or a monitoring check can use it as it is.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from comfyveil import cli, config, config_load, logs
from comfyveil.anyone import runtime
from comfyveil.comfy import limits as comfy_limits
from comfyveil.comfy import pool as pool_mod
from comfyveil.errors import ComfyveilError
from comfyveil.store import database


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help=cli.SUBCOMMANDS["status"],
        description="Show the database, every configured backend (up or down, its queue, "
        "the models or nodes each command misses there) and every worker's heartbeat. "
        "Exit 1 when the database does not answer, no backend is up or no worker is alive.",
    )
    parser.add_argument("--config", type=Path, default=None, metavar="FILE")
    parser.set_defaults(handler=run)


def _ago(when: dt.datetime | None, now: dt.datetime) -> str:
    if when is None:
        return "-"
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


async def gather(settings: config.Settings) -> list[tuple[str, str, str, str]]:
    """Rows of (part, name, state, detail); the state is ok, down, gone or a count."""
    rows: list[tuple[str, str, str, str]] = []
    db = None
    try:
        db = await database.Database.open(settings, run_migrations=False)
    except ComfyveilError as exc:
        rows.append(("database", "", "down", str(exc)))
    try:
        commands = []
        if db is not None:
            status = await db.migration_status()
            counts = await db.heartbeats.queue_counts()
            where = "embedded" if settings.database.url is None else "external"
            pending = f", {len(status.pending)} migration(s) pending" if status.pending else ""
            rows.append(
                (
                    "database",
                    where,
                    "ok",
                    f"schema {status.current or '-'}{pending}; {counts.get('queued', 0)} queued, "
                    f"{counts.get('running', 0)} running",
                )
            )
            if not status.pending:
                commands = await db.commands.list(enabled_only=True)
        rows.extend(await _backends(settings, commands))
        if db is not None and not (await db.migration_status()).pending:
            now = dt.datetime.now(dt.UTC)
            beats = await db.heartbeats.all(settings.worker.lease_seconds)
            if not beats:
                rows.append(("worker", "", "none", "no worker has written a heartbeat"))
            for b in beats:
                rows.append(
                    (
                        "worker",
                        b.worker_id,
                        "alive" if b.alive else "gone",
                        f"{b.host}, v{b.version}, started {_ago(b.started_at, now)}, "
                        f"seen {_ago(b.last_seen, now)}, {b.jobs_running} job(s) running",
                    )
                )
    finally:
        if db is not None:
            await db.close()
    return rows


async def _backends(
    settings: config.Settings, commands: list[Any]
) -> list[tuple[str, str, str, str]]:
    rows = []
    async with (
        runtime.anon_for(settings, settings.backend_list()) as router,
        pool_mod.Pool(
            settings.backend_list(),
            proxy_for=router.proxy_for,
            limits=comfy_limits.outputs(settings.limits),
        ) as backends,
    ):
        for backend in backends.backends.values():
            if not backend.healthy:
                rows.append(("backend", backend.name, "down", backend.last_error or ""))
                continue
            # One short line per backend: which commands it cannot run and why in a word
            # (every file name made ~40 wrapped lines); `models check` and /backends name
            # the files.
            why: dict[str, list[str]] = {}
            files: set[str] = set()
            for command in commands:
                try:
                    problems = backend.problems(command.to_workflow())
                except Exception as exc:  # a stored command that no longer loads
                    problems = [f"cannot be read ({type(exc).__name__})"]
                if problems:
                    models = [m["what"] for p in problems if (m := _MISSING_MODEL.match(p))]
                    files.update(models)
                    reason = ("models missing" if models
                              else "nodes missing" if any(p.startswith("node type")
                                                          for p in problems)
                              else problems[0])
                    why.setdefault(reason, []).append(f"/{command.command}")
            detail = f"{backend.remote_queue} in its queue"
            if not why:
                detail += "; every command can run"
            else:
                detail += "; cannot run " + "; ".join(
                    f"{' '.join(names)} ({reason})" for reason, names in why.items())
                if files:
                    detail += f"; {len(files)} model file(s) missing: see /backends or " \
                              "`comfyveil models check`"
            rows.append(("backend", backend.name, "up", detail))
    return rows


_MISSING_MODEL = re.compile(r"^model file (?P<what>.+?)(?: \([^)]*\))? is not installed$")


async def run(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    logs.apply_settings(settings)
    rows = await gather(settings)
    table = Table(title="comfyveil status", show_lines=False)
    for column in ("part", "name", "state", "detail"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(soft_wrap=False).print(table)
    ok = (
        any(p == "database" and s == "ok" for p, _, s, _ in rows)
        and any(p == "backend" and s == "up" for p, _, s, _ in rows)
        and any(p == "worker" and s == "alive" for p, _, s, _ in rows)
    )
    return 0 if ok else 1


__all__ = ["gather", "register", "run"]
