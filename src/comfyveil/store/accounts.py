"""The web front end's own tables: accounts, invitations and sessions (migration 0015).

Jobs, outputs, settings, quotas and forgetting are the shared store's (`store.jobs`,
`store.users`); this module adds only what a browser needs to log in, plus read-only
listings (history and gallery pages) that the bot has no use for.

Tokens (invitations, sessions) are stored as sha256 digests only.

Telegram ids (users and chats alike) lie within +-2^53. A web account's own id is
placed below -2^62, so it never collides with one; its jobs carry it as `chat_id` for
their whole life, which tells every Telegram part that the job is not theirs to deliver.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

from comfyveil import constant_time
from comfyveil.i18n import N_
from comfyveil.store import errors, jobs, users
from comfyveil.store.pooled import PoolStore

WEB_ID_BASE = -(1 << 62)


def web_user_id(account_id: int) -> int:
    """The user id (and chat id) a new web account gets."""
    return WEB_ID_BASE - account_id


def is_web_chat(chat_id: int) -> bool:
    """True for the chat id of a job queued from the web front end."""
    return chat_id <= WEB_ID_BASE

Row = dict[str, Any]
TOKEN_BYTES = 32


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


LINK_CODE_SECONDS = 15 * 60  # a code shown at 10:14 works until 10:30 at least


def link_code(account: Account, *, at: float | None = None) -> str:
    """The short code a web account's owner sends to the bot (``/web CODE``) from her
    own Telegram to link the two. It names the account and is signed with a key only the
    database holds (the passphrase hash: a new passphrase retires every code), so no
    table and no process memory keep it; it changes every LINK_CODE_SECONDS."""
    window = int((time.time() if at is None else at) // LINK_CODE_SECONDS)
    mac = hmac.new(
        account.passphrase.encode(), b"link:%d:%d" % (account.id, window), hashlib.sha256
    ).digest()
    return f"{account.id}-{base64.b32encode(mac).decode()[:8]}"


class NameTaken(errors.StoreError):
    """That name is taken; choose another."""


class InviteInvalid(errors.StoreError):
    """This invitation link is not valid (used, expired or mistyped)."""


# The errors' sentences, for the catalogs (the pages translate them where shown).
NAME_TAKEN = N_("That name is taken; choose another.")
INVITE_INVALID = N_("This invitation link is not valid (used, expired or mistyped).")


@dataclass(frozen=True)
class Account:
    id: int
    name: str
    user_id: int  # the store's user (a web id, or the Telegram user it was linked to)
    chat_id: int  # the chat id its jobs carry (always a web id)
    passphrase: str
    is_admin: bool
    disabled: bool
    failed_logins: int
    locked_until: dt.datetime | None
    created_at: dt.datetime
    last_login_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: Row) -> Account:
        return cls(
            id=row["id"],
            name=row["name"],
            user_id=row["user_id"],
            chat_id=row["chat_id"],
            passphrase=row["passphrase"],
            is_admin=row["is_admin"],
            disabled=row["disabled"],
            failed_logins=row["failed_logins"],
            locked_until=row["locked_until"],
            created_at=row["created_at"],
            last_login_at=row["last_login_at"],
        )

    def __repr__(self) -> str:  # never the passphrase hash
        return f"Account(id={self.id}, name={self.name!r}, admin={self.is_admin})"


@dataclass(frozen=True)
class Invite:
    is_admin: bool
    created_at: dt.datetime
    expires_at: dt.datetime
    used_at: dt.datetime | None
    used_by_name: str | None
    ref: str  # a short, non-secret label of the token (for the admin page)


@dataclass(frozen=True)
class GalleryItem:
    job_id: uuid.UUID
    index: int
    command: str
    kind: str
    mime: str
    created_at: dt.datetime
    prompt: str = ""  # the job's prompt, to tell results apart


@dataclass(frozen=True)
class OutputInfo:
    index: int
    filename: str
    kind: str
    mime: str
    size: int


@dataclass(frozen=True)
class Visitor:
    """A signed-in visitor: the account, its session's CSRF token, and its users row
    (None before the account's first job or setting wrote one)."""

    account: Account
    csrf: str
    user: users.User | None


_ACCOUNT_COLUMNS = (
    "id, name, user_id, chat_id, passphrase, is_admin, disabled, failed_logins, "
    "locked_until, created_at, last_login_at"
)


# The note of the first admin's invitation (made while no account exists).
FIRST_ADMIN = "first admin"
_CLOSE_FIRST_ADMIN = "DELETE FROM web_invites WHERE note = 'first admin' AND used_at IS NULL"


class WebStore(PoolStore):
    async def _one(self, query: Any, params: dict[str, Any] | None = None) -> Row | None:
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            cursor = await conn.execute(query, params)
            return await cursor.fetchone() if cursor.description else None

    # -- invitations -------------------------------------------------------------------

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

    # -- read-only listings ------------------------------------------------------------

    async def history(self, user_id: int, *, limit: int, offset: int) -> list[Row]:
        return await self._all(
            "SELECT id, command, status, params->>'prompt' AS prompt, created_at, "
            "finished_at, error, progress->>'state' AS state FROM jobs WHERE user_id = %(u)s "
            "ORDER BY created_at DESC, id LIMIT %(limit)s OFFSET %(offset)s",
            {"u": user_id, "limit": limit, "offset": offset},
        )

    async def gallery(self, user_id: int, *, limit: int, offset: int) -> list[GalleryItem]:
        rows = await self._all(
            "SELECT o.job_id, o.index, j.command, o.kind, o.mime, j.created_at, "
            "left(j.params->>'prompt', 200) AS prompt "
            "FROM jobs j JOIN job_outputs o ON o.job_id = j.id "
            "WHERE j.user_id = %(u)s AND j.status = 'succeeded' "
            "ORDER BY j.created_at DESC, o.job_id, o.index LIMIT %(limit)s OFFSET %(offset)s",
            {"u": user_id, "limit": limit, "offset": offset},
        )
        return [
            GalleryItem(
                job_id=r["job_id"],
                index=r["index"],
                command=r["command"],
                kind=r["kind"],
                mime=r["mime"],
                created_at=r["created_at"],
                prompt=r["prompt"] or "",
            )
            for r in rows
        ]

    async def job_with_files(
        self, job_id: uuid.UUID
    ) -> tuple[jobs.Job, list[OutputInfo], list[tuple[int, str]]] | None:
        """A job with its outputs (without their bytes) and the (index, mime) of its kept
        input images, in one round trip: what a job's page shows."""
        row = await self._one(
            "SELECT j.*, "
            "coalesce((SELECT json_agg(json_build_array(o.index, o.filename, o.kind, o.mime, "
            "o.size) ORDER BY o.index) FROM job_outputs o WHERE o.job_id = j.id), '[]') "
            "AS output_list, "
            "coalesce((SELECT json_agg(json_build_array(i.index, i.mime) ORDER BY i.index) "
            "FROM job_inputs i WHERE i.job_id = j.id), '[]') AS input_list "
            "FROM jobs j WHERE j.id = %(id)s",
            {"id": job_id},
        )
        if row is None:
            return None
        return (
            jobs.Job.from_row(row),
            [OutputInfo(*o) for o in row["output_list"]],
            [(i, m) for i, m in row["input_list"]],
        )

    async def output_owner(self, job_id: uuid.UUID) -> int | None:
        row = await self._one("SELECT user_id FROM jobs WHERE id = %(id)s", {"id": job_id})
        return int(row["user_id"]) if row else None


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
