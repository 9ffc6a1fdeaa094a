"""Linking a web account and a Telegram user, both ways: a link token made by `/web`
in the chat and spent in the browser, or a link code shown in the browser and sent to the
bot. Linking moves the web account's jobs, settings and quota onto the Telegram user."""

from __future__ import annotations

import time
from typing import Any

from comfyveil import constant_time
from comfyveil.i18n import N_
from comfyveil.store import errors
from comfyveil.store.accounts import (
    _ACCOUNT_COLUMNS,
    LINK_CODE_SECONDS,
    Account,
    InviteInvalid,
    NameTaken,
    digest,
    link_code,
    new_token,
    web_user_id,
)
from comfyveil.store.web_logins import WebLogins


class WebLinks(WebLogins):
    """The links (web_links) between web accounts and Telegram users."""

    # -- linking a Telegram user -------------------------------------------------------

    async def create_link(self, telegram_user_id: int, *, minutes: float) -> str:
        """A one-time link token for this Telegram user (from `/web` in the chat)."""
        token = new_token()
        await self._one(
            "INSERT INTO web_links (token_hash, telegram_user_id, expires_at) "
            "VALUES (%(h)s, %(tg)s, now() + make_interval(secs => %(secs)s))",
            {"h": digest(token), "tg": telegram_user_id, "secs": minutes * 60},
        )
        return token

    async def link_user(self, token: str) -> int | None:
        """The Telegram user a live link token stands for (the token stays usable)."""
        row = await self._one(
            "SELECT telegram_user_id FROM web_links WHERE token_hash = %(h)s "
            "AND expires_at > now()",
            {"h": digest(token)},
        )
        return int(row["telegram_user_id"]) if row else None

    async def account_of_user(self, user_id: int) -> Account | None:
        row = await self._one(
            f"SELECT {_ACCOUNT_COLUMNS} FROM web_accounts WHERE user_id = %(u)s", {"u": user_id}
        )
        return Account.from_row(row) if row else None

    async def account_for_code(self, code: str) -> Account | None:
        """The web account a ``/web CODE`` links, while the code is fresh and the account
        is linked to no Telegram user yet (so a code works once); else None."""
        head, _, _ = code.strip().partition("-")
        if not head.isdigit() or len(code) > 40:
            return None
        account = await self.account(int(head))
        if account is None or account.disabled or account.user_id != account.chat_id:
            return None
        now = time.time()
        fresh = (link_code(account, at=now), link_code(account, at=now - LINK_CODE_SECONDS))
        if not any(constant_time.same(code.strip().upper(), c.upper()) for c in fresh):
            return None
        return account

    async def link_account(self, account_id: int, telegram_user_id: int) -> None:
        """Make the web account the Telegram user's (what ``/web CODE`` does): its jobs,
        settings and quota move to the Telegram user, so the chat and the web show one
        history.

        Raises:
            InviteInvalid: the account is gone.
            NameTaken: the Telegram user already has another web account.
        """
        async with errors.wrap_exceptions(), self.pool.connection() as conn, conn.transaction():
            await _merge(conn, telegram_user_id, account_id)

    async def use_link(self, token: str, account_id: int | None) -> int:
        """Spend a link token; with `account_id`, make that account the Telegram user's.

        Linking moves the account's jobs, settings and quota to the Telegram user, so the
        chat and the web show one history. Returns the Telegram user id.

        Raises:
            InviteInvalid: the link was used, expired or never made.
            NameTaken: (reused) the Telegram user already has another web account.
        """
        async with errors.wrap_exceptions(), self.pool.connection() as conn, conn.transaction():
            tg = await _spend_link(conn, token)
            if account_id is not None:
                await _merge(conn, tg, account_id)
        return tg

    async def sign_up_linked(self, token: str, name: str, passphrase_hash: str) -> Account:
        """A new account for the Telegram user of a link token (the token is spent).

        Raises:
            InviteInvalid, NameTaken.
        """
        async with errors.wrap_exceptions(), self.pool.connection() as conn, conn.transaction():
            tg = await _spend_link(conn, token)
            cursor = await conn.execute(
                "SELECT 1 FROM web_accounts WHERE name_key = %(k)s OR user_id = %(tg)s",
                {"k": name.casefold(), "tg": tg},
            )
            if await cursor.fetchone() is not None:
                raise NameTaken()
            cursor = await conn.execute("SELECT nextval('web_account_seq') AS id")
            seq = await cursor.fetchone()
            assert seq is not None
            account_id = int(seq["id"])
            cursor = await conn.execute(
                f"INSERT INTO web_accounts (id, name, name_key, passphrase, user_id, chat_id) "
                f"VALUES (%(id)s, %(name)s, %(key)s, %(pw)s, %(tg)s, %(chat)s) "
                f"RETURNING {_ACCOUNT_COLUMNS}",
                {
                    "id": account_id,
                    "name": name,
                    "key": name.casefold(),
                    "pw": passphrase_hash,
                    "tg": tg,
                    "chat": web_user_id(account_id),
                },
            )
            created = await cursor.fetchone()
        assert created is not None
        return Account.from_row(created)


async def _spend_link(conn: Any, token: str) -> int:
    """Delete a live `/web` link token and return its Telegram user id (one use only).

    Raises:
        InviteInvalid: the link was used, expired or never made.
    """
    cursor = await conn.execute(
        "DELETE FROM web_links WHERE token_hash = %(h)s AND expires_at > now() "
        "RETURNING telegram_user_id",
        {"h": digest(token)},
    )
    row = await cursor.fetchone()
    if row is None:
        raise InviteInvalid("This link is not valid any more; send /web in the chat again.")
    return int(row["telegram_user_id"])


async def _merge(conn: Any, tg: int, account_id: int) -> None:
    """Move a web account, its jobs, settings and quota onto Telegram user `tg`."""
    cursor = await conn.execute(
        "SELECT id, user_id FROM web_accounts WHERE user_id = %(tg)s OR id = %(id)s "
        "FOR UPDATE",
        {"tg": tg, "id": account_id},
    )
    rows = await cursor.fetchall()
    mine = next((r for r in rows if r["id"] == account_id), None)
    if mine is None:
        raise InviteInvalid(N_("That account does not exist any more."))
    if any(r["id"] != account_id for r in rows):
        raise NameTaken(
            N_("Your Telegram account is already linked to another web account."))
    old = int(mine["user_id"])
    if old == tg:
        return
    params = {"old": old, "tg": tg}
    await conn.execute("UPDATE jobs SET user_id = %(tg)s WHERE user_id = %(old)s", params)
    await conn.execute(
        "UPDATE chat_sessions SET user_id = %(tg)s WHERE user_id = %(old)s", params
    )
    await conn.execute("DELETE FROM queue_turns WHERE user_id = %(old)s", params)
    # One user now: today's jobs of both count against one quota.
    await conn.execute(
        "INSERT INTO user_usage (user_id, day, jobs_today, last_job_at) "
        "SELECT %(tg)s, day, jobs_today, last_job_at FROM user_usage "
        "WHERE user_id = %(old)s "
        "ON CONFLICT (user_id) DO UPDATE SET "
        "jobs_today = CASE WHEN user_usage.day = excluded.day "
        "  THEN user_usage.jobs_today + excluded.jobs_today "
        "  WHEN user_usage.day > excluded.day THEN user_usage.jobs_today "
        "  ELSE excluded.jobs_today END, "
        "day = greatest(user_usage.day, excluded.day), "
        "last_job_at = greatest(user_usage.last_job_at, excluded.last_job_at)",
        params,
    )
    await conn.execute("DELETE FROM user_usage WHERE user_id = %(old)s", params)
    # The chat's own settings win where both have one; a web quota is kept if
    # the chat user had none.
    await conn.execute(
        "INSERT INTO users (id, settings, daily_quota) "
        "SELECT %(tg)s, settings, daily_quota FROM users WHERE id = %(old)s "
        "ON CONFLICT (id) DO UPDATE SET settings = excluded.settings || users.settings, "
        "daily_quota = coalesce(users.daily_quota, excluded.daily_quota), "
        "updated_at = now()",
        params,
    )
    await conn.execute("DELETE FROM users WHERE id = %(old)s", params)
    await conn.execute(
        "UPDATE web_accounts SET user_id = %(tg)s WHERE id = %(id)s",
        {"tg": tg, "id": account_id},
    )
