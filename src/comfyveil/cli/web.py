"""`comfyveil web`: the web front end (with a worker and the database), without Telegram.

comfyveil web [--config FILE]                serve it until SIGTERM or Ctrl-C
comfyveil web invite [--admin] [--config F]   print a one-time sign-up link
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from comfyveil import cli, config


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "web",
        help=cli.SUBCOMMANDS["web"],
        description="Serve the web front end ([web] host and port, 127.0.0.1:8080 by "
        "default) with a worker and the database, until SIGTERM or Ctrl-C; or, with "
        "`invite`, print a one-time link that creates an account.",
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=["serve", "invite"],
        default="serve",
        help="serve (default) or invite",
    )
    parser.add_argument(
        "--admin", action="store_true", help="invite: the new account may use the admin pages"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="settings file (default: COMFYVEIL_CONFIG, else ./comfyveil.toml)",
    )
    parser.set_defaults(handler=run)


async def run(args: argparse.Namespace) -> int:
    settings = config.load(args.config)
    if args.action == "invite":
        return await invite(settings, admin=args.admin)
    if args.admin:
        raise config.ConfigError("--admin goes with `comfyveil web invite`")
    from comfyveil.cli.run import serve

    return await serve(settings, telegram=False, web=True)


async def invite(settings: config.Settings, *, admin: bool) -> int:
    from comfyveil.store import accounts as store
    from comfyveil.store import database
    from comfyveil.web import server

    async with await database.Database.open(settings) as db:
        token = await store.WebStore(db.pool).create_invite(
            is_admin=admin, hours=settings.web.invite_hours
        )
    url = server.link_base(settings)  # the .anon address once published
    hours = settings.web.invite_hours
    print(f"{url}/invite/{token}")
    print(f"(works once, for {hours:g} hours{'; an admin account' if admin else ''})")
    return 0
