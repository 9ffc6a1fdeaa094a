"""Invitations to the web front end: made by an admin (or at the first start, for the
first admin), listed, revoked, and used once to sign up."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from comfyveil.store import errors
from comfyveil.store.accounts import (
    _ACCOUNT_COLUMNS,
    Account,
    InviteInvalid,
    NameTaken,
    WebRows,
    digest,
    new_token,
    web_user_id,
)


@dataclass(frozen=True)
class Invite:
    is_admin: bool
    created_at: dt.datetime
    expires_at: dt.datetime
    used_at: dt.datetime | None
    used_by_name: str | None
    ref: str  # a short, non-secret label of the token (for the admin page)


# The note of the first admin's invitation (made while no account exists).
FIRST_ADMIN = "first admin"
_CLOSE_FIRST_ADMIN = "DELETE FROM web_invites WHERE note = 'first admin' AND used_at IS NULL"


class WebInvites(WebRows):
    """The invitations (table web_invites)."""

    async def create_invite(
        self, *, is_admin: bool, hours: float, created_by: int | None = None
    ) -> str:
        """A new one-time invitation; its token (shown once, stored only as a digest).

        An admin invitation made while no account exists is the first admin's: it
        replaces any earlier unused one (one live link at most), and the first sign-up
        closes it (see `sign_up`)."""
        token = new_token()
        async with errors.wrap_exceptions(), self.pool.connection() as conn, conn.transaction():
            # One at a time: two starts at once must not leave two first-admin links.
            await conn.execute("LOCK TABLE web_invites IN SHARE ROW EXCLUSIVE MODE")
            cursor = await conn.execute("SELECT EXISTS (SELECT 1 FROM web_accounts) AS any")
            row = await cursor.fetchone()
            first = is_admin and created_by is None and row is not None and not row["any"]
            if first:
                await conn.execute(_CLOSE_FIRST_ADMIN)
            await conn.execute(
                "INSERT INTO web_invites (token_hash, is_admin, created_by, expires_at, note) "
                "VALUES (%(h)s, %(admin)s, %(by)s, now() + make_interval(secs => %(secs)s), "
                "%(note)s)",
                {
                    "h": digest(token),
                    "admin": is_admin,
                    "by": created_by,
                    "secs": hours * 3600,
                    "note": FIRST_ADMIN if first else "",
                },
            )
        return token

    async def close_first_admin_invites(self) -> None:
        """Close every unused first-admin invitation (an account exists now)."""
        await self._one(_CLOSE_FIRST_ADMIN)

    async def invite_open(self, token: str) -> bool:
        row = await self._one(
            "SELECT 1 AS ok FROM web_invites WHERE token_hash = %(h)s AND used_at IS NULL "
            "AND expires_at > now()",
            {"h": digest(token)},
        )
        return row is not None

    async def invites(self, *, limit: int = 50) -> list[Invite]:
        rows = await self._all(
            "SELECT i.token_hash, i.is_admin, i.created_at, i.expires_at, i.used_at, "
            "a.name AS used_by_name FROM web_invites i "
            "LEFT JOIN web_accounts a ON a.id = i.used_by "
            "ORDER BY i.created_at DESC LIMIT %(limit)s",
            {"limit": limit},
        )
        return [
            Invite(
                is_admin=r["is_admin"],
                created_at=r["created_at"],
                expires_at=r["expires_at"],
                used_at=r["used_at"],
                used_by_name=r["used_by_name"],
                ref=bytes(r["token_hash"]).hex()[:8],
            )
            for r in rows
        ]

    async def revoke_invite(self, ref: str) -> bool:
        row = await self._one(
            "DELETE FROM web_invites WHERE used_at IS NULL "
            "AND left(encode(token_hash, 'hex'), 8) = %(ref)s RETURNING 1 AS ok",
            {"ref": ref},
        )
        return row is not None

    async def sign_up(self, token: str, name: str, passphrase_hash: str) -> Account:
        """Use an invitation: create the account it allows, once.

        Raises:
            InviteInvalid: used, expired or unknown.
            NameTaken: another account has this name (case-insensitively).
        """
        async with errors.wrap_exceptions(), self.pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "SELECT is_admin FROM web_invites WHERE token_hash = %(h)s "
                "AND used_at IS NULL AND expires_at > now() FOR UPDATE",
                {"h": digest(token)},
            )
            invite = await cursor.fetchone()
            if invite is None:
                raise InviteInvalid()
            cursor = await conn.execute(
                "SELECT 1 FROM web_accounts WHERE name_key = %(k)s", {"k": name.casefold()}
            )
            if await cursor.fetchone() is not None:
                raise NameTaken()
            cursor = await conn.execute("SELECT nextval('web_account_seq') AS id")
            row = await cursor.fetchone()
            assert row is not None
            account_id = int(row["id"])
            user_id = web_user_id(account_id)
            cursor = await conn.execute(
                f"INSERT INTO web_accounts (id, name, name_key, passphrase, user_id, chat_id, "
                f"is_admin) VALUES (%(id)s, %(name)s, %(key)s, %(pw)s, %(uid)s, %(uid)s, "
                f"%(admin)s) RETURNING {_ACCOUNT_COLUMNS}",
                {
                    "id": account_id,
                    "name": name,
                    "key": name.casefold(),
                    "pw": passphrase_hash,
                    "uid": user_id,
                    "admin": invite["is_admin"],
                },
            )
            created = await cursor.fetchone()
            await conn.execute(
                "UPDATE web_invites SET used_at = now(), used_by = %(id)s WHERE token_hash = %(h)s",
                {"id": account_id, "h": digest(token)},
            )
            # An account exists now: no other link may open a first admin account.
            await conn.execute(_CLOSE_FIRST_ADMIN)
        assert created is not None
        return Account.from_row(created)
