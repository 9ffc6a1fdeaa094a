"""What a web account is: the web front end's own tables (migration 0015) hold accounts,
invitations, sessions and links to Telegram users; this module has the account itself,
its ids, the tokens and link codes, and the base of the stores of those tables. The
stores, one module each, are put together in `web_tables.WebStore`: `web_invites`,
`web_logins` (accounts and sessions), `web_links`, `web_listings`.

Jobs, outputs, settings, quotas and forgetting are the shared store's (`store.jobs`,
`store.users`); the web adds only what a browser needs to log in, plus read-only
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
from dataclasses import dataclass
from typing import Any

from comfyveil.i18n import N_
from comfyveil.store import errors, users
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


class WebRows(PoolStore):
    """The base of the web tables' stores."""

    async def _one(self, query: Any, params: dict[str, Any] | None = None) -> Row | None:
        async with errors.wrap_exceptions(), self.pool.connection() as conn:
            cursor = await conn.execute(query, params)
            return await cursor.fetchone() if cursor.description else None
