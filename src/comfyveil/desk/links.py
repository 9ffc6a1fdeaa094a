"""Where the web front end is reached from elsewhere, and the one-time links that tie a
Telegram user to a web account: the chat asks the desk for a link, never the web code.
"""

from __future__ import annotations

import contextlib

from psycopg_pool import AsyncConnectionPool

from comfyveil import config
from comfyveil.store import accounts, web_tables

SERVICE_NAME = "web"  # the web front end's hidden service (its directory under anon/hs)
LINK_MINUTES = 15  # how long a chat's /web link stays good (it works once)


def public_url(settings: config.Settings, port: int) -> str:
    w = settings.web
    if w.public_url:
        return w.public_url
    host = f"[{w.host}]" if ":" in w.host else w.host
    return f"http://{host}:{port}"


def link_base(settings: config.Settings) -> str:
    """The address to put in links sent elsewhere (the chat): `[web] public_url`, else
    the hidden service's address when published, else host and port."""
    if settings.web.public_url:
        return settings.web.public_url
    if settings.web.hidden_service:
        hostname = settings.data_dir / "anon" / "hs" / SERVICE_NAME / "hostname"
        with contextlib.suppress(OSError):
            return f"http://{hostname.read_text().strip()}"
    return public_url(settings, settings.web.port)


async def web_link(settings: config.Settings, pool: AsyncConnectionPool, user_id: int) -> str:
    """A one-time address that makes a web account for `user_id` or logs into the one
    linked to it (with its passphrase); it never links an existing account."""
    token = await web_tables.WebStore(pool).create_link(user_id, minutes=LINK_MINUTES)
    return f"{link_base(settings)}/link/{token}"


async def link_by_code(
    pool: AsyncConnectionPool, code: str, user_id: int
) -> accounts.Account | None:
    """``/web CODE``: link the web account whose Settings page showed `code` to Telegram
    user `user_id` (who sent it from their own Telegram, which proves they own both);
    None when the code is not valid (stale, mistyped, or used).

    Raises:
        NameTaken: `user_id` already has another web account.
        InviteInvalid: the account went away meanwhile.
    """
    store = web_tables.WebStore(pool)
    account = await store.account_for_code(code)
    if account is not None:
        await store.link_account(account.id, user_id)
    return account
