"""Who may use the bot, and how much.

- Admins: the ids in ``[telegram] admins``, and users given the ``admin`` role.
- Everyone else needs one of: ``[telegram] open = true``, their user id or the chat's id
  in ``[telegram] allow``, or an admin's ``/allow ID`` (kept in the users table).
- ``/ban ID`` refuses a user everywhere, even in open mode (config admins cannot be banned).
- Limits per user (admins are exempt): jobs waiting or running at once
  (``[limits] max_queued``), jobs per UTC day (``[limits] daily_quota``, or the user's own
  quota set with ``/quota``), and a cooldown between two jobs (``[limits] cooldown``).
  The first two are enforced by the store inside the enqueue transaction; the cooldown
  is kept here, in memory, per bot process.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from comfyveil import config, errors
from comfyveil.store import users

ALLOWED_KEY = "allowed"  # users.settings flag written by /allow


class NotAllowed(errors.UsageError):
    """You are not allowed to use this bot."""


class CoolingDown(errors.UsageError):
    """Wait a moment before your next job."""


@dataclass(frozen=True)
class Who:
    """The sender of an update, as access control sees them."""

    user_id: int
    chat_id: int
    role: str  # user | admin | banned
    is_admin: bool
    allowed: bool
    # The users row read by `identify`, kept for the life of one update so handlers need
    # not read it again (None: the user has no row yet).
    user: users.User | None = field(default=None, compare=False, repr=False)

    @property
    def settings(self) -> dict[str, Any]:
        """The user's own settings as read for this update ({} without a row)."""
        return dict(self.user.settings) if self.user is not None else {}


class Access:
    """Decides who may do what; reads roles from the users table."""

    def __init__(self, settings: config.Settings, user_store: users.UserStore) -> None:
        self.settings = settings
        self.users = user_store
        self._last_job: dict[int, float] = {}  # user id -> monotonic time of their last job

    async def identify(self, user_id: int, chat_id: int) -> Who:
        """Who is writing, with their role and whether they may use the bot."""
        tg = self.settings.telegram
        user = await self.users.get(user_id)
        role = user.role if user is not None else "user"
        config_admin = user_id in tg.admins
        is_admin = config_admin or role == "admin"
        if role == "banned" and not config_admin:
            return Who(user_id, chat_id, role, False, False, user)
        granted = bool(user is not None and user.settings.get(ALLOWED_KEY))
        allowed = (
            is_admin or tg.open or granted or user_id in tg.allow or chat_id in tg.allow
        )
        return Who(user_id, chat_id, role, is_admin, allowed, user)

    async def require(self, user_id: int, chat_id: int) -> Who:
        """`identify`, refusing with a plain sentence those who may not use the bot.

        Raises:
            NotAllowed: banned, or not on the allow-list in a closed bot.
        """
        who = await self.identify(user_id, chat_id)
        if who.role == "banned" and not who.is_admin:
            raise NotAllowed("You are not allowed to use this bot.")
        if not who.allowed:
            raise NotAllowed(
                f"This bot is private. Ask its operator to allow your id {user_id}."
            )
        return who

    def require_admin(self, who: Who) -> None:
        if not who.is_admin:
            raise NotAllowed("Only the bot's admins can do that.")

    def limits(self, who: Who) -> tuple[int | None, int | None]:
        """(max jobs waiting or running, daily quota) for this user; None: no limit."""
        if who.is_admin:
            return None, None
        lim = self.settings.limits
        return lim.max_queued, lim.daily_quota

    def check_cooldown(self, who: Who) -> None:
        """Raises CoolingDown when the user's last job was too recent."""
        cooldown = self.settings.limits.cooldown
        if who.is_admin or cooldown <= 0:
            return
        last = self._last_job.get(who.user_id)
        if last is None:
            return
        left = cooldown - (time.monotonic() - last)
        if left > 0:
            seconds = math.ceil(left)
            raise CoolingDown(
                f"Wait {seconds} second{'s' if seconds != 1 else ''} before your next job."
            )

    def note_job(self, user_id: int) -> None:
        self._last_job[user_id] = time.monotonic()
        if len(self._last_job) > 10_000:  # forget the oldest half rather than grow forever
            for uid, _ in sorted(self._last_job.items(), key=lambda i: i[1])[:5_000]:
                self._last_job.pop(uid, None)

    async def allow(self, user_id: int) -> None:
        """An admin's /allow: lift a ban and grant use of a closed bot."""
        user = await self.users.get(user_id)
        if user is not None and user.role == "banned":
            await self.users.set_role(user_id, "user")
        await self.users.update_settings(user_id, {ALLOWED_KEY: True})

    async def ban(self, user_id: int) -> None:
        if user_id in self.settings.telegram.admins:
            raise errors.UsageError("An admin named in the configuration cannot be banned.")
        await self.users.set_role(user_id, "banned")
        await self.users.update_settings(user_id, {}, remove=[ALLOWED_KEY])
