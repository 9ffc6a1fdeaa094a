"""What every handler needs, in one typed object (``context.services``).

PTB keeps application-wide state in ``bot_data``, a dict keyed by strings; handlers here
read one typed :class:`Services` instead, through :class:`BotContext`, a custom
``CallbackContext`` registered with ``ContextTypes`` in :mod:`comfyveil.telegram.app`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from telegram.ext import Application, CallbackContext, ExtBot

from comfyveil import config

if TYPE_CHECKING:
    from comfyveil.comfy import pool as pool_mod
    from comfyveil.store import database
    from comfyveil.telegram import access, registry, status

SERVICES_KEY = "comfyveil"


@dataclass(eq=False)
class Services:
    """The bot's collaborators, built once by :func:`comfyveil.telegram.app.build`.

    Attributes:
        pool: the backend pool when a worker runs in this process (for /backends).
        file_jobs: jobs whose user asked for ``--file``: delivered as documents.
    """

    settings: config.Settings
    db: database.Database
    access: access.Access
    commands: registry.CommandRegistry
    tracker: status.StatusTracker
    pool: pool_mod.Pool | None = None
    bot_username: str = ""
    file_jobs: set[uuid.UUID] = field(default_factory=set)


class BotContext(CallbackContext[ExtBot[None], dict[Any, Any], dict[Any, Any], dict[Any, Any]]):
    """The handlers' context: PTB's, plus ``services``."""

    @property
    def services(self) -> Services:
        services = self.application.bot_data.get(SERVICES_KEY)
        if services is None:
            raise RuntimeError("the bot was built without its services")
        return services  # type: ignore[no-any-return]


def attach(application: Application[Any, Any, Any, Any, Any, Any], services: Services) -> None:
    application.bot_data[SERVICES_KEY] = services
