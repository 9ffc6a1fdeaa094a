"""Chat users: role, own settings, daily quota override, and forgetting them entirely."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from comfyveil.errors import UsageError
from comfyveil.store.connector import Connector, Row

logger = logging.getLogger(__name__)

Role = Literal["user", "admin", "banned"]
ROLES: tuple[Role, ...] = ("user", "admin", "banned")


@dataclass(frozen=True)
class User:
    id: int  # Telegram user id
    role: Role
    settings: dict[str, Any]
    daily_quota: int | None  # None: the configured default
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def from_row(cls, row: Row) -> User:
        return cls(
            id=row["id"], role=row["role"], settings=row["settings"],
            daily_quota=row["daily_quota"], created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise UsageError(f"unknown role {role!r}; use one of: {', '.join(ROLES)}")


class UserStore:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.db = Connector(pool)

    async def get_or_create(self, user_id: int, *, role: Role = "user") -> User:
        """The user's row; created with `role` the first time the user is seen."""
        _check_role(role)
        row = await self.db.one("get_or_create_user", user_id=user_id, role=role)
        assert row is not None
        return User.from_row(row)

    async def get(self, user_id: int) -> User | None:
        row = await self.db.one("get_user", user_id=user_id)
        return User.from_row(row) if row else None

    async def set_role(self, user_id: int, role: Role) -> User:
        _check_role(role)
        row = await self.db.one("set_user_role", user_id=user_id, role=role)
        assert row is not None
        return User.from_row(row)

    async def set_daily_quota(self, user_id: int, quota: int | None) -> User:
        """Give one user their own daily quota (None: back to the configured default)."""
        if quota is not None and quota < 0:
            raise UsageError("a daily quota cannot be negative")
        row = await self.db.one("set_user_daily_quota", user_id=user_id, daily_quota=quota)
        assert row is not None
        return User.from_row(row)

    async def settings(self, user_id: int) -> dict[str, Any]:
        user = await self.get(user_id)
        return dict(user.settings) if user else {}

    async def update_settings(
        self, user_id: int, changes: Mapping[str, Any], remove: Iterable[str] = ()
    ) -> dict[str, Any]:
        """Merge `changes` into the user's settings, drop the keys in `remove`; the result."""
        row = await self.db.one(
            "update_user_settings", user_id=user_id, changes=Jsonb(dict(changes)),
            remove=list(remove),
        )
        assert row is not None
        return dict(row["settings"])

    async def admin_ids(self) -> list[int]:
        """Users given the admin role (those named in the configuration aside)."""
        return [int(row["id"]) for row in await self.db.all("list_admin_ids")]

    async def overview(self, *, limit: int = 40) -> list[dict[str, Any]]:
        """The most recently active users: id, role, daily_quota, granted, today."""
        return [dict(row) for row in await self.db.all("list_users", limit=limit)]

    async def quota_used_today(self, user_id: int) -> int:
        """Jobs the user created since midnight UTC."""
        row = await self.db.one("quota_used_today", user_id=user_id)
        return int(row["used"]) if row else 0

    async def forget(self, user_id: int) -> int:
        """Delete everything stored about a user; the number of jobs deleted.

        Jobs go with their input images, outputs, events, delivery records and webhook
        deliveries; then the user's chat sessions, queue turn and settings. A job running
        on a GPU right now keeps only its id, command and owner until its worker, told by
        the cancel request, interrupts it there and ends it cancelled. What limits the
        user stays: the usage counters (jobs today, the last job's time, no content) and
        an admin's role, quota or /allow for them, so forgetting never resets a quota, a
        cooldown or a ban.
        """
        async with self.db.session(transaction=True) as s:
            row = await s.one("forget_user_jobs", user_id=user_id)
            await s.run("forget_user_rest", user_id=user_id)
        logger.info("user forgotten", extra={"action": "user_forgotten"})
        return int(row["deleted"]) if row else 0
