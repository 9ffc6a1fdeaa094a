"""Who may use the bot, and how much.

- Admins: the ids in ``[telegram] admins``, and users given the ``admin`` role.
- Everyone else needs one of: ``[telegram] open = true``, their user id or the chat's id
  in ``[telegram] allow``, or an admin's ``/allow ID`` (kept in the users table).
- ``/ban ID`` refuses a user everywhere, even in open mode (config admins cannot be banned).
- Limits per user (admins are exempt): jobs waiting or running at once
  (``[limits] max_queued``), jobs per UTC day (``[limits] daily_quota``, or the user's own
  quota set with ``/quota``), and a cooldown between two jobs (``[limits] cooldown``).
  All three are checked and recorded by the store in the enqueue statement, under a lock
  per user, and counted in a row that /forget keeps; the bot asks the same question
  before it downloads a user's image (`Limits.check`).
- Workflow commands may be for admins only (``comfyveil workflows add --admins-only``):
  `role_of` is the role a command's ``allowed_roles`` is matched against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from comfyveil import config, errors
from comfyveil.i18n import N_, _, ltr
from comfyveil.store import accounts, users

if TYPE_CHECKING:
    from comfyveil.desk.services import Desk

ALLOWED_KEY = "allowed"  # users.settings flag written by /allow


# Said wherever limits are shown or set (the chat's /users and /quota, the web's users
# page): admins have none, so a count against a quota would mislead.
NO_LIMITS = N_("No limits: admins have none.")
QUOTA_FOR_ADMIN = N_("Admins have no limits: {user}'s quota applies once they are no "
                     "longer an admin.")


class NotAllowed(errors.UsageError):
    """You are not allowed to use this bot."""


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
    def command_role(self) -> str:
        """The role a command's allowed_roles is matched against (admins named in the
        configuration are admins whatever their row says)."""
        return "admin" if self.is_admin else "user"

    @property
    def settings(self) -> dict[str, Any]:
        """The user's own settings as read for this update ({} without a row)."""
        return dict(self.user.settings) if self.user is not None else {}


class Access:
    """Decides who may do what; reads roles from the users table."""

    def __init__(self, settings: config.Settings, user_store: users.UserStore) -> None:
        self.settings = settings
        self.users = user_store

    async def identify(self, user_id: int, chat_id: int) -> Who:
        """Who is writing, with their role and whether they may use the bot."""
        return self.decide(user_id, chat_id, await self.users.get(user_id))

    def decide(self, user_id: int, chat_id: int, user: users.User | None) -> Who:
        """`identify` with the user's row (None: none yet) read already, e.g. with an API
        key in one query."""
        tg = self.settings.telegram
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
            raise NotAllowed(_("You are not allowed to use this bot."))
        if not who.allowed:
            raise NotAllowed(
                _("This bot is private. Ask its operator to allow your id {id}.").format(
                    id=ltr(user_id))
            )
        return who

    def require_admin(self, who: Who) -> None:
        if not who.is_admin:
            raise NotAllowed(_("Only the bot's admins can do that."))

    def exempt(self, user_id: int, role: str, *, web_admin: bool = False) -> bool:
        """Whether this user has no limits (an admin: by the configuration, their role, or
        a web account marked admin): the one answer `limits` and every page use."""
        return user_id in self.settings.telegram.admins or role == "admin" or web_admin

    def limits(self, who: Who) -> dict[str, Any]:
        """The enqueue limits of this user as keywords of `JobStore.enqueue` and
        `JobStore.check_limits` (None: no limit; admins have none)."""
        if who.is_admin:
            return {"max_active": None, "daily_quota": None, "cooldown": None}
        lim = self.settings.limits
        return {"max_active": lim.max_queued, "daily_quota": lim.daily_quota,
                "cooldown": lim.cooldown or None}

    async def allow(self, user_id: int) -> None:
        """An admin's /allow: lift a ban and grant use of a closed bot."""
        user = await self.users.get(user_id)
        if user is not None and user.role == "banned":
            await self.users.set_role(user_id, "user")
        await self.users.update_settings(user_id, {ALLOWED_KEY: True})

    async def ban(self, user_id: int) -> None:
        if user_id in self.settings.telegram.admins:
            raise errors.UsageError(_("An admin named in the configuration cannot be banned."))
        await self.users.set_role(user_id, "banned")
        await self.users.update_settings(user_id, {}, remove=[ALLOWED_KEY])


def who_with(svc: Desk, account: accounts.Account, user: users.User | None) -> Who:
    """The account as the chat's access rules see it, given its users row (None: none
    yet) read already (one rule for both front ends, issue 22 §13): a linked account is
    its Telegram user, so ``[telegram] admins``, ``allow``, ``open``, /allow and /ban
    decide for it as in the chat; an account of the web alone came by invitation, which
    is its allowance. A web admin is an admin."""
    who = svc.access.decide(account.user_id, account.chat_id, user)
    linked = account.user_id != account.chat_id
    is_admin = who.is_admin or account.is_admin
    banned = who.role == "banned" and not is_admin
    return Who(
        user_id=account.user_id,
        chat_id=account.chat_id,
        role=who.role,
        is_admin=is_admin,
        allowed=not banned and (is_admin or who.allowed or not linked),
        user=who.user,
    )
