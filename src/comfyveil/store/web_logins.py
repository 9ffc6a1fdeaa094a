"""Web accounts and their sessions: finding an account, its failed logins and
lock-out, its passphrase, admin flag and ban; and the sessions that keep a browser
signed in."""

from __future__ import annotations

from comfyveil.store import errors, users
from comfyveil.store.accounts import (
    _ACCOUNT_COLUMNS,
    Account,
    Row,
    Visitor,
    WebRows,
    digest,
    new_token,
)


class WebLogins(WebRows):
    """The accounts (web_accounts) and sessions (web_sessions)."""

    # -- accounts ----------------------------------------------------------------------

    async def account_by_name(self, name: str) -> Account | None:
        row = await self._one(
            f"SELECT {_ACCOUNT_COLUMNS} FROM web_accounts WHERE name_key = %(k)s",
            {"k": name.casefold()},
        )
        return Account.from_row(row) if row else None

    async def account(self, account_id: int) -> Account | None:
        row = await self._one(
            f"SELECT {_ACCOUNT_COLUMNS} FROM web_accounts WHERE id = %(id)s", {"id": account_id}
        )
        return Account.from_row(row) if row else None

    async def account_count(self) -> int:
        row = await self._one("SELECT count(*) AS n FROM web_accounts")
        return int(row["n"]) if row is not None else 0

    async def accounts(self, *, limit: int = 200) -> list[Row]:
        """Accounts for the admin page, with the store's role, quota and jobs today."""
        return await self._all(
            "SELECT a.id, a.name, a.user_id, a.is_admin, a.disabled, a.created_at, "
            "a.last_login_at, coalesce(u.role, 'user') AS role, u.daily_quota, "
            # The quota's own count (user_usage): a refunded failure is not in it, as it is
            # not in the chat's /users or the quota check.
            "coalesce((SELECT g.jobs_today FROM user_usage g WHERE g.user_id = a.user_id "
            " AND g.day = (now() AT TIME ZONE 'UTC')::date), 0) AS today "
            "FROM web_accounts a LEFT JOIN users u ON u.id = a.user_id "
            "ORDER BY a.created_at DESC LIMIT %(limit)s",
            {"limit": limit},
        )

    async def failed_login(self, account_id: int, *, free: int, max_delay: float) -> None:
        """Count a failed login; after `free` of them each one locks the account for
        twice as long as the previous, up to `max_delay` seconds."""
        await self._one(
            "UPDATE web_accounts SET failed_logins = failed_logins + 1, "
            "locked_until = CASE WHEN failed_logins + 1 > %(free)s THEN now() + make_interval("
            " secs => least(%(max)s, power(2, failed_logins + 1 - %(free)s))) "
            " ELSE locked_until END WHERE id = %(id)s",
            {"id": account_id, "free": free, "max": max_delay},
        )

    async def logged_in(self, account_id: int) -> None:
        await self._one(
            "UPDATE web_accounts SET failed_logins = 0, locked_until = NULL, "
            "last_login_at = now() WHERE id = %(id)s",
            {"id": account_id},
        )

    async def set_passphrase(self, account_id: int, passphrase_hash: str) -> None:
        await self._one(
            "UPDATE web_accounts SET passphrase = %(pw)s WHERE id = %(id)s",
            {"id": account_id, "pw": passphrase_hash},
        )

    async def set_admin(self, account_id: int, is_admin: bool) -> None:
        await self._one(
            "UPDATE web_accounts SET is_admin = %(a)s WHERE id = %(id)s",
            {"id": account_id, "a": is_admin},
        )

    async def set_disabled(self, account_id: int, disabled: bool) -> None:
        """Ban (or unban) an account: a banned one is logged out everywhere at once."""
        async with errors.wrap_exceptions(), self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                "UPDATE web_accounts SET disabled = %(d)s WHERE id = %(id)s",
                {"id": account_id, "d": disabled},
            )
            if disabled:
                await conn.execute(
                    "DELETE FROM web_sessions WHERE account_id = %(id)s", {"id": account_id}
                )

    async def delete_account(self, account_id: int) -> None:
        await self._one("DELETE FROM web_accounts WHERE id = %(id)s", {"id": account_id})

    # -- sessions ----------------------------------------------------------------------

    async def create_session(self, account_id: int, *, hours: float) -> tuple[str, str]:
        """A new session; (cookie token, CSRF token)."""
        token, csrf = new_token(), new_token()
        await self._one(
            "INSERT INTO web_sessions (token_hash, account_id, csrf, expires_at) "
            "VALUES (%(h)s, %(id)s, %(csrf)s, now() + make_interval(secs => %(secs)s))",
            {"h": digest(token), "id": account_id, "csrf": csrf, "secs": hours * 3600},
        )
        return token, csrf

    async def session(self, token: str) -> Visitor | None:
        """The live session's account, CSRF token and users row, in one round trip (every
        page needs all three); None when expired, unknown or banned."""
        row = await self._one(
            f"SELECT s.csrf, {', '.join('a.' + c.strip() for c in _ACCOUNT_COLUMNS.split(','))}, "
            "u.id AS u_id, u.role AS u_role, u.settings AS u_settings, "
            "u.daily_quota AS u_daily_quota, u.created_at AS u_created_at, "
            "u.updated_at AS u_updated_at "
            "FROM web_sessions s JOIN web_accounts a ON a.id = s.account_id "
            "LEFT JOIN users u ON u.id = a.user_id "
            "WHERE s.token_hash = %(h)s AND s.expires_at > now() AND NOT a.disabled",
            {"h": digest(token)},
        )
        if row is None:
            return None
        user = None
        if row["u_id"] is not None:
            user = users.User.from_row({k[2:]: v for k, v in row.items() if k.startswith("u_")})
        return Visitor(Account.from_row(row), row["csrf"], user)

    async def end_session(self, token: str) -> None:
        await self._one("DELETE FROM web_sessions WHERE token_hash = %(h)s", {"h": digest(token)})

    async def purge(self) -> None:
        """Drop expired sessions and invitations (the live ones are checked on use)."""
        await self._one("DELETE FROM web_sessions WHERE expires_at <= now()")
        await self._one("DELETE FROM web_invites WHERE used_at IS NULL AND expires_at <= now()")
        await self._one("DELETE FROM web_links WHERE expires_at <= now()")
