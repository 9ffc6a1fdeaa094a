"""Keys of the images API (migration 0018): made for a web account, shown once, kept as
a sha256 digest. A key is 32 random bytes, so a fast hash is right here (argon2 guards
what people choose; nothing about a random key can be guessed), and looking one up costs
a single indexed read per request, which brings the account's users row along (its role
and settings: who may do what)."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass

from comfyveil.store.accounts import _ACCOUNT_COLUMNS, Account, digest
from comfyveil.store.pooled import PoolStore
from comfyveil.store.users import User

PREFIX = "cv-"  # tells a comfyveil key from others in a config file or a leak scanner
HINT = 4  # trailing characters shown in the list, to tell keys apart
MAX_LABEL = 60
MAX_KEY = 200  # longer is not one of ours: not even hashed
_ACCOUNT = ", ".join("a." + c.strip() for c in _ACCOUNT_COLUMNS.split(","))
_USER_COLUMNS = ("id", "role", "settings", "daily_quota", "created_at", "updated_at")
_USER = ", ".join(f"u.{c} AS u_{c}" for c in _USER_COLUMNS)


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ApiKey:
    id: int
    label: str
    hint: str
    created_at: dt.datetime
    last_used_at: dt.datetime | None


class ApiKeyStore(PoolStore):
    async def create(self, account_id: int, label: str = "") -> str:
        """A new key for the account; the key itself (shown once, never stored)."""
        key = new_key()
        await self._all(
            "INSERT INTO web_api_keys (account_id, label, key_hash, hint) "
            "VALUES (%(a)s, %(l)s, %(h)s, %(hint)s)",
            {
                "a": account_id,
                "l": label.strip()[:MAX_LABEL],
                "h": digest(key),
                "hint": key[-HINT:],
            },
        )
        return key

    async def account(self, key: str) -> tuple[Account, User | None] | None:
        """The account a key belongs to, with its users row (None: it has none yet), in
        one query, as each request of the API asks; None: the key is unknown or revoked,
        or the account banned. Notes when the key was last used (at most once a minute,
        to spare writes)."""
        if not key.startswith(PREFIX) or len(key) > MAX_KEY:
            return None
        rows = await self._all(
            f"SELECT k.id AS key_id, k.last_used_at AS key_used, {_ACCOUNT}, {_USER} "
            "FROM web_api_keys k JOIN web_accounts a ON a.id = k.account_id "
            "LEFT JOIN users u ON u.id = a.user_id "
            "WHERE k.key_hash = %(h)s AND NOT a.disabled",
            {"h": digest(key)},
        )
        if not rows:
            return None
        row = rows[0]
        used = row["key_used"]
        if used is None or dt.datetime.now(dt.UTC) - used > dt.timedelta(minutes=1):
            await self._all(
                "UPDATE web_api_keys SET last_used_at = now() WHERE id = %(id)s",
                {"id": row["key_id"]},
            )
        user = None
        if row["u_id"] is not None:
            user = User.from_row({c: row["u_" + c] for c in _USER_COLUMNS})
        return Account.from_row(row), user

    async def keys(self, account_id: int) -> list[ApiKey]:
        rows = await self._all(
            "SELECT id, label, hint, created_at, last_used_at FROM web_api_keys "
            "WHERE account_id = %(a)s ORDER BY created_at, id",
            {"a": account_id},
        )
        return [ApiKey(**r) for r in rows]

    async def revoke(self, account_id: int, key_id: int) -> bool:
        """Delete one of the account's keys; False when it has no such key."""
        rows = await self._all(
            "DELETE FROM web_api_keys WHERE id = %(id)s AND account_id = %(a)s RETURNING id",
            {"id": key_id, "a": account_id},
        )
        return bool(rows)
