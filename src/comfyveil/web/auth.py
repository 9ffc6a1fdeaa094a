"""Logging in: passphrases (argon2id), sessions, CSRF tokens and slowing down guessers.

Behind a hidden service every request comes from 127.0.0.1, so there is no client address
to limit by. Failed logins are slowed per account (the store locks an account for twice
as long after each failure past the first few) and overall (a budget of failures per
minute for the whole site, kept in the database for every web process; past it, every
login waits until the minute has passed).

Neither lock can be turned against an account's owner: a browser that signed in to the
account before carries a device cookie (an HMAC keyed by the account's passphrase hash,
so a new passphrase retires it), and with it the right passphrase logs in whatever the
locks say. Every refused login, for a real name or an unknown one, locked or not, gets
the same sentence after the same argon2 verification, so names cannot be probed.
Hashing runs on a small pool of its own: a burst of logins or sign-ups (64 MiB each)
waits there, and never starves the image checks and thumbnails of threads.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import datetime as dt
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from argon2.low_level import ARGON2_VERSION

from comfyveil import config, constant_time, metrics
from comfyveil.i18n import _
from comfyveil.store import accounts as web_store
from comfyveil.store import web_state, web_tables

SESSION_COOKIE = "comfyveil_session"
ANON_COOKIE = "comfyveil_form"  # ties a logged-out form to the browser that fetched it
DEVICE_COOKIE = "comfyveil_device"  # a browser that signed in to an account before
DEVICE_DAYS = 365
HASHES_AT_ONCE = 2  # argon2id runs (64 MiB each) at a time
FREE_FAILURES = 3  # failed logins per account before they start to lock it
MAX_LOCK_SECONDS = 15 * 60
SITE_FAILURES_PER_MINUTE = 30
MIN_PASSPHRASE = 10
MAX_PASSPHRASE = 1024
MAX_NAME = 40

_hashing = concurrent.futures.ThreadPoolExecutor(HASHES_AT_ONCE, thread_name_prefix="argon2")


class Passphrases:
    """argon2id hashing at the site's cost (`[web] passphrase_memory_mib` and
    `passphrase_iterations`, whose defaults are RFC 9106's second recommendation; 4
    lanes). A hash keeps its own parameters, so a changed cost applies to passphrases set
    after the change and every stored one still verifies."""

    @classmethod
    def for_site(cls, web: config.WebConfig) -> Passphrases:
        return cls(web.passphrase_memory_mib, web.passphrase_iterations)

    def __init__(self, memory_mib: int, iterations: int) -> None:
        self.hasher = PasswordHasher(time_cost=iterations, memory_cost=memory_mib * 1024)
        # Verified when the name is unknown, so a wrong name costs as long as a wrong
        # passphrase. Written, not hashed (a hash costs a process 0.27 s of CPU at start):
        # argon2 costs the same whatever the digest, and an unknown name never logs in.
        self.dummy_hash = self._unmatchable_hash()

    def _unmatchable_hash(self) -> str:
        h = self.hasher
        salt, digest = (
            base64.b64encode(secrets.token_bytes(n)).decode().rstrip("=")
            for n in (h.salt_len, h.hash_len)
        )
        return (
            f"$argon2id$v={ARGON2_VERSION}$m={h.memory_cost},t={h.time_cost},"
            f"p={h.parallelism}${salt}${digest}"
        )

    async def hash(self, passphrase: str) -> str:
        return await asyncio.get_running_loop().run_in_executor(
            _hashing, self.hasher.hash, passphrase
        )

    async def verify(self, stored: str | None, passphrase: str) -> bool:
        """Whether `passphrase` is the one `stored` was made of; None (no such account)
        costs as long and is never right."""

        def check() -> bool:
            try:
                return self.hasher.verify(stored or self.dummy_hash, passphrase) and (
                    stored is not None
                )
            except (VerificationError, InvalidHashError):
                return False

        return await asyncio.get_running_loop().run_in_executor(_hashing, check)


def device_token(account: web_store.Account) -> str:
    """The device cookie of a browser that signed in to `account`."""
    mac = hmac.new(account.passphrase.encode(), b"device:%d" % account.id, hashlib.sha256)
    return f"{account.id}.{mac.hexdigest()}"


def _known_device(account: web_store.Account | None, cookie: str | None) -> bool:
    if account is None or not cookie:
        return False
    return constant_time.same(cookie, device_token(account))


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
        return constant_time.same(token, self.token_for(cookie))


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
    web: web_tables.WebStore,
    site: SiteThrottle,
    passphrases: Passphrases,
    name: str,
    passphrase: str,
    *,
    device: str | None = None,
) -> web_store.Account:
    """The account `name` if `passphrase` is its own and it may log in now.

    `device` is the browser's device cookie: a browser that signed in to this account
    before is not held by the account's lock or the site's.

    Raises:
        LoginRefused: with the sentence to show: one for a wrong name, a wrong
            passphrase, a locked or a banned account, so that names and passphrases
            cannot be probed; another when the whole site is throttled.
    """
    account = await web.account_by_name(name) if name else None
    known = _known_device(account, device)
    wait = await site.wait_seconds()
    if wait > 0 and not known:
        metrics.web_login("refused")
        raise LoginRefused(
            _("Too many failed logins on this site; try again in {n} seconds.").format(
                n=int(wait) + 1
            )
        )
    # Verified whatever follows, so every refusal takes as long as a wrong passphrase.
    ok = await passphrases.verify(account.passphrase if account else None, passphrase)
    now = dt.datetime.now(dt.UTC)
    locked = (
        account is not None and account.locked_until is not None and account.locked_until > now
    )
    if account is None or not ok or (locked and not known) or account.disabled:
        await site.failed()
        if account is not None and not ok:
            await web.failed_login(account.id, free=FREE_FAILURES, max_delay=MAX_LOCK_SECONDS)
        # one answer for all, in the metrics too: a count that told a locked or banned
        # account's right passphrase from a wrong one would confirm a guess
        metrics.web_login("failed")
        raise LoginRefused(refused_sentence())
    await web.logged_in(account.id)
    metrics.web_login("succeeded")
    return account


def refused_sentence() -> str:
    return _(
        "Wrong name or passphrase, or too many failed logins with this name: try again "
        "later, or from a browser that signed in to this account before."
    )
