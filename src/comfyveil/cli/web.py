"""`comfyveil web`: the web front end (with a worker and the database), without Telegram.

comfyveil web [--config FILE]                serve it until SIGTERM or Ctrl-C
comfyveil web invite [--admin] [--config F]   print a one-time sign-up link
comfyveil web apikey ACCOUNT [--label NAME]   make a key of the images API, printed once
comfyveil web webhook ACCOUNT URL             register a webhook endpoint; its secret printed once
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from comfyveil import cli, config, config_load


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
        choices=["serve", "invite", "apikey", "webhook"],
        default="serve",
        help="serve (default), invite, apikey or webhook",
    )
    parser.add_argument("account", nargs="?", default=None, help="apikey, webhook: the web account")
    parser.add_argument("url", nargs="?", default=None, help="webhook: the endpoint's URL")
    parser.add_argument(
        "--label", default="", metavar="NAME", help="apikey: a name to tell the key apart"
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
    settings = config_load.load(args.config)
    if args.action == "invite":
        return await invite(settings, admin=args.admin)
    if args.action == "apikey":
        return await apikey(settings, args.account, args.label)
    if args.action == "webhook":
        return await webhook(settings, args.account, args.url)
    if args.account is not None:
        raise config.ConfigError("an account name goes with `comfyveil web apikey ACCOUNT`")
    if args.admin:
        raise config.ConfigError("--admin goes with `comfyveil web invite`")
    from comfyveil.cli.run import serve

    return await serve(settings, telegram=False, web=True)


async def invite(settings: config.Settings, *, admin: bool) -> int:
    from comfyveil.store import database, web_tables
    from comfyveil.web import server

    async with await database.Database.open(settings) as db:
        token = await web_tables.WebStore(db.pool).create_invite(
            is_admin=admin, hours=settings.web.invite_hours
        )
    url = server.link_base(settings)  # the .anon address once published
    hours = settings.web.invite_hours
    print(f"{url}/invite/{token}")
    print(f"(works once, for {hours:g} hours{'; an admin account' if admin else ''})")
    return 0


async def apikey(settings: config.Settings, name: str | None, label: str) -> int:
    """Make a key of the images API for the account `name` and print it (only now: the
    store keeps its digest)."""
    from comfyveil.errors import UsageError
    from comfyveil.store import api_keys, database, web_tables

    if not name:
        raise UsageError("name the account: comfyveil web apikey ACCOUNT [--label NAME]")
    if not settings.api.enabled:
        raise UsageError("the images API is off ([api] enabled = false): no key to make")
    async with await database.Database.open(settings) as db:
        account = await web_tables.WebStore(db.pool).account_by_name(name)
        if account is None:
            raise UsageError(f"there is no web account named {name!r}")
        key = await api_keys.ApiKeyStore(db.pool).create(account.id, label)
    from comfyveil.desk import links

    print(key)
    print("(shown once; revoke it on the settings page. Use it as the OpenAI API key with "
          f"the base URL {links.link_base(settings).rstrip('/')}/v1)")
    return 0


async def webhook(settings: config.Settings, name: str | None, url: str | None) -> int:
    """Register a webhook endpoint of the account `name` and print its secret (only now)."""
    from comfyveil.desk import webhook_targets
    from comfyveil.errors import UsageError
    from comfyveil.store import database, web_tables
    from comfyveil.store import webhooks as webhook_store

    if not name or not url:
        raise UsageError("name the account and the URL: comfyveil web webhook ACCOUNT URL")
    if not settings.api.enabled:
        raise UsageError("the API is off ([api] enabled = false): no webhook to send")
    api = settings.api
    await webhook_targets.check(
        url, private_ok=api.webhook_private_targets, resolve=api.webhooks_via != "anon"
    )
    async with await database.Database.open(settings) as db:
        account = await web_tables.WebStore(db.pool).account_by_name(name)
        if account is None:
            raise UsageError(f"there is no web account named {name!r}")
        _id, secret = await webhook_store.WebhookStore(db.pool).create(account.id, url.strip())
    print(secret)
    print(
        "(shown once: verify each delivery's webhook-signature with it; the events are "
        "job.succeeded, job.failed and job.cancelled)"
    )
    return 0
