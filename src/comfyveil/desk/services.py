"""What the desk needs of a front end's shared parts. The bot's `Services` and the web's
`WebServices` both have these (under the same names), so the desk takes either and
knows neither."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from comfyveil import config
    from comfyveil import policy as policy_mod
    from comfyveil.comfy import pool as pool_mod
    from comfyveil.desk import access
    from comfyveil.store import database, web_tables


class Desk(Protocol):
    @property
    def settings(self) -> config.Settings: ...

    @property
    def db(self) -> database.Database: ...

    @property
    def access(self) -> access.Access: ...


class PolicyDesk(Desk, Protocol):
    @property
    def policy(self) -> policy_mod.Policy: ...


class RunDesk(Desk, Protocol):
    """A front end that knows the backend pool (None: no worker in this process)."""

    @property
    def pool(self) -> pool_mod.Pool | None: ...


class PoolDesk(PolicyDesk, RunDesk, Protocol):
    pass


class AccountDesk(Desk, Protocol):
    @property
    def web(self) -> web_tables.WebStore: ...
