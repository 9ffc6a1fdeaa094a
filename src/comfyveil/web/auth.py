"""Logging in: passphrases (argon2id), sessions, CSRF tokens and slowing down guessers.

Behind a hidden service every request comes from 127.0.0.1, so there is no client address
to limit by. Failed logins are slowed per account (the store locks an account for twice
as long after each failure past the first few) and overall (a budget of failures per
minute for the whole site, kept in the database for every web process; past it, every
login waits until the minute has passed).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from comfyveil import metrics
from comfyveil.i18n import _
from comfyveil.store import accounts as web_store
from comfyveil.store import web_state

SESSION_COOKIE = "comfyveil_session"
ANON_COOKIE = "comfyveil_form"  # ties a logged-out form to the browser that fetched it
FREE_FAILURES = 3  # failed logins per account before they start to lock it
MAX_LOCK_SECONDS = 15 * 60
SITE_FAILURES_PER_MINUTE = 30
MIN_PASSPHRASE = 10
MAX_PASSPHRASE = 1024
MAX_NAME = 40

# argon2id with the library's defaults (RFC 9106's second recommendation, 64 MiB).
_hasher = PasswordHasher()
# Verified when the name is unknown, so a wrong name costs as long as a wrong passphrase.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))


async def hash_passphrase(passphrase: str) -> str:
    return await asyncio.to_thread(_hasher.hash, passphrase)


async def verify_passphrase(stored: str | None, passphrase: str) -> bool:
    def check() -> bool:
        try:
            return _hasher.verify(stored or _DUMMY_HASH, passphrase) and stored is not None
        except (VerificationError, InvalidHashError):
            return False

    return await asyncio.to_thread(check)


def check_name(name: str) -> str | None:
    """Why a chosen account name is not acceptable, or None."""
    if not name:
        return _("Choose a name.")
    if len(name) > MAX_NAME:
        return _("A name has at most {n} characters.").format(n=MAX_NAME)
    if not all(c.isalnum() or c in "._-" for c in name):
        return _("A name may use letters, digits, dots, dashes and underscores.")
    return None


def check_passphrase(passphrase: str, again: str) -> str | None:
    if len(passphrase) < MIN_PASSPHRASE:
        return _("A passphrase has at least {n} characters.").format(n=MIN_PASSPHRASE)
    if len(passphrase) > MAX_PASSPHRASE:
        return _("A passphrase has at most {n} characters.").format(n=MAX_PASSPHRASE)
    if passphrase != again:
        return _("The two passphrases differ.")
    return None


class FormTokens:
    """CSRF tokens for forms shown before login (login, sign-up), bound to a cookie.

    A logged-in session has its own token in the database; a logged-out visitor gets a
    random cookie and forms carry an HMAC of it under the site's secret, which every web
    process reads from the database (`WebState.secret`), so any of them accepts a form
    another one served. Without a secret (a test's bare application) a random one.
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def token_for(self, cookie: str) -> str:
        return hmac.new(self._secret, cookie.encode(), hashlib.sha256).hexdigest()

    def valid(self, cookie: str | None, token: str | None) -> bool:
        if not cookie or not token:
            return False
        return hmac.compare_digest(self.token_for(cookie), token)


@dataclass
class SiteThrottle:
    """Failed logins of the whole site in the last minute, counted in the database so
    that every web process over it sees the same count."""

    state: web_state.WebState
    per_minute: int = SITE_FAILURES_PER_MINUTE
    window: float = 60.0

    async def wait_seconds(self) -> float:
        """How long logins are refused now (0: not refused)."""
        count, oldest = await self.state.login_failures(self.window)
        if count < self.per_minute:
            return 0.0
        return max(0.0, self.window - oldest)

    async def failed(self) -> None:
        await self.state.login_failed(self.window)


class LoginRefused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


async def login(
    web: web_store.WebStore, site: SiteThrottle, name: str, passphrase: str
) -> web_store.Account:
    """The account `name` if `passphrase` is its own and it may log in now.

    Raises:
        LoginRefused: with the sentence to show (the same for a wrong name and a wrong
            passphrase, so names cannot be probed).
    """
    wait = await site.wait_seconds()
    if wait > 0:
        metrics.web_login("refused")
        raise LoginRefused(
            _("Too many failed logins on this site; try again in {n} seconds.").format(
                n=int(wait) + 1
            )
        )
    account = await web.account_by_name(name) if name else None
    if account is not None and account.locked_until is not None:
        left = (account.locked_until - dt.datetime.now(dt.UTC)).total_seconds()
        if left > 0:
            metrics.web_login("refused")
            raise LoginRefused(
                _("Too many failed logins for this account; try again in {n} seconds.").format(
                    n=int(left) + 1
                )
            )
    ok = await verify_passphrase(account.passphrase if account else None, passphrase)
    if not ok or account is None:
        await site.failed()
        if account is not None:
            await web.failed_login(account.id, free=FREE_FAILURES, max_delay=MAX_LOCK_SECONDS)
        metrics.web_login("failed")
        raise LoginRefused(_("Wrong name or passphrase."))
    if account.disabled:
        metrics.web_login("refused")
        raise LoginRefused(_("This account is banned."))
    await web.logged_in(account.id)
    metrics.web_login("succeeded")
    return account
