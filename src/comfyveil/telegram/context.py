"""What every handler needs, in one typed object (``context.services``).

PTB keeps application-wide state in ``bot_data``, a dict keyed by strings; handlers here
read one typed :class:`Services` instead, through :class:`BotContext`, a custom
``CallbackContext`` registered with ``ContextTypes`` in :mod:`comfyveil.telegram.app`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from telegram.ext import Application, CallbackContext, ExtBot

from comfyveil import config
from comfyveil import policy as policy_mod

if TYPE_CHECKING:
    from comfyveil.comfy import pool as pool_mod
    from comfyveil.desk import access, registry
    from comfyveil.store import database
    from comfyveil.telegram import status

SERVICES_KEY = "comfyveil"
DELIVERY_MODES_KEPT = 10_000  # jobs queued here whose delivery mode is remembered


@dataclass(eq=False)
class Services:
    """The bot's collaborators, built once by :func:`comfyveil.telegram.app.build`.

    Attributes:
        pool: the backend pool when a worker runs in this process (for /backends).
        file_jobs: jobs whose user asked for ``--file``: delivered as documents.
        delivery_modes: for jobs queued by this process, their user and whether the result
            goes as a file, decided when queued; the sink then reads nothing back.
    """

    settings: config.Settings
    db: database.Database
    access: access.Access
    commands: registry.CommandRegistry
    tracker: status.StatusTracker
    pool: pool_mod.Pool | None = None
    bot_username: str = ""
    file_jobs: set[uuid.UUID] = field(default_factory=set)
    delivery_modes: dict[uuid.UUID, tuple[int, bool]] = field(default_factory=dict)
    # job -> (the chat message that asked for it, who asked in a group): the result
    # answers it. Kept in the job's row too, once its status message is posted.
    origins: dict[uuid.UUID, tuple[int | None, str | None]] = field(default_factory=dict)
    background: set[asyncio.Task[Any]] = field(default_factory=set)

    def spawn(self, work: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run `work` beside the handlers (cleaning GPU hosts after /forget), keeping a
        reference so the task is not collected half-way."""
        task = asyncio.create_task(work, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task
    policy: policy_mod.Policy = field(default_factory=policy_mod.Policy)
    # Jobs queued here whose user's /settings hide results behind a spoiler.
    spoiler_jobs: set[uuid.UUID] = field(default_factory=set)
    # The language each job queued here was asked in: its status and result speak it.
    job_languages: dict[uuid.UUID, str] = field(default_factory=dict)

    def remember_delivery(
        self, job_id: uuid.UUID, user_id: int, *, as_file: bool,
        reply_to: int | None = None, asked_by: str | None = None,
    ) -> None:
        self.delivery_modes[job_id] = (user_id, as_file)
        while len(self.delivery_modes) > DELIVERY_MODES_KEPT:  # never delivered: forget
            self.delivery_modes.pop(next(iter(self.delivery_modes)))
        if reply_to is not None or asked_by is not None:
            self.origins[job_id] = (reply_to, asked_by)
            while len(self.origins) > DELIVERY_MODES_KEPT:
                self.origins.pop(next(iter(self.origins)))

    def forget_deliveries_of(self, user_id: int) -> None:
        """The user asked to be forgotten: their results must be looked up (and found gone)."""
        for job_id in [j for j, (uid, _) in self.delivery_modes.items() if uid == user_id]:
            del self.delivery_modes[job_id]
            self.origins.pop(job_id, None)


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
