"""The chat commands the bot offers: the enabled rows of the commands table, as workflows.

The table is the source of truth (operators enable, disable and add commands while the
bot runs, possibly from another process), so the registry re-reads it when its copy is
older than ``REFRESH_SECONDS`` or when told to. Parsed workflows are cached by hash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from comfyveil import i18n
from comfyveil.comfy import workflow
from comfyveil.i18n import _
from comfyveil.store import commands as commands_store
from comfyveil.store import database

if TYPE_CHECKING:
    from comfyveil.desk.access import Who

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 30.0
NAMED_OPTIONS = ("seed", "steps", "width", "height")  # shown first in /help
HIDDEN_OPTIONS = ("negative",)  # given with --no, explained in the /help footer


# What help shows of a command (the chat's /help, the web's form), front end aside.
@dataclass(frozen=True)
class OptionHelp:
    name: str
    description: str
    minimum: float | None = None
    maximum: float | None = None
    default: str | float | None = None


@dataclass(frozen=True)
class CommandHelp:
    name: str
    title: str
    description: str = ""
    options: Sequence[OptionHelp] = field(default_factory=tuple)
    takes_image: bool = False
    negative: bool = False  # takes --no (a negative prompt)
    sized: bool = False  # has width and height, so takes --ar


@dataclass(frozen=True)
class Entry:
    """One enabled command and its workflow."""

    name: str
    command: commands_store.Command
    workflow: workflow.Workflow

    @property
    def options(self) -> dict[str, str]:
        """Inline options users may give: name (and alias) -> description."""
        wf = self.workflow
        skip = {wf.prompt_param, *wf.image_params, *HIDDEN_OPTIONS}
        result: dict[str, str] = {}
        for name, param in wf.params.items():
            if name in skip:
                continue
            for key in (name, *param.aliases):
                result[key] = param.described() or name
        return result

    @property
    def negative_allowed(self) -> bool:
        param = self.workflow.params.get("negative")
        return param is not None and param.type == "text"

    @property
    def takes_image(self) -> bool:
        return bool(self.workflow.image_params)

    @property
    def admins_only(self) -> bool:
        return "user" not in self.command.allowed_roles

    def allows(self, who: Who) -> bool:
        """Whether this user may run the command (`workflows add --admins-only`)."""
        return who.command_role in self.command.allowed_roles

    def help(self) -> CommandHelp:
        wf = self.workflow
        skip = {wf.prompt_param, *wf.image_params, *HIDDEN_OPTIONS}
        names = [n for n in wf.params if n not in skip]
        names.sort(key=lambda n: (NAMED_OPTIONS.index(n) if n in NAMED_OPTIONS else 99))
        options = []
        for name in names:
            p = wf.params[name]
            default = p.default
            if default is None and p.type not in ("seed", "image"):
                default = graph_value(wf, name)
            options.append(
                OptionHelp(
                    name=name, description=p.described() or name,
                    minimum=p.min, maximum=p.max,
                    default=default if isinstance(default, int | float | str) else None,
                )
            )
        return CommandHelp(
            name=self.name, title=self.title(), description=self.description(),
            options=tuple(options), takes_image=self.takes_image,
            negative=self.negative_allowed,
            sized="width" in wf.params and "height" in wf.params,
        )

    def title(self) -> str:
        """The title in the current language: the workflow's own translation, else the
        catalog's (shipped workflows), else the default text."""
        wf = self.workflow
        return _local(wf.title_in(i18n.current()), self.command.title or wf.title)

    def description(self) -> str:
        wf = self.workflow
        return _local(wf.description_in(i18n.current()), self.command.description)


def _local(own: str, default: str) -> str:
    """`own` when the workflow translated the text itself, else the catalog's translation
    of `default` (the shipped workflows' texts are in it; an operator's are not and stay)."""
    if own and own != default:
        return own
    return _(default) if default else default


def graph_value(wf: workflow.Workflow, name: str) -> object:
    """The value the workflow's graph holds for parameter `name` (its built-in default)."""
    param = wf.params.get(name)
    if param is None or not param.targets:
        return None
    target = param.targets[0]
    node = wf.graph.get(target.node)
    if not isinstance(node, Mapping):
        return None
    inputs = node.get("inputs")
    return inputs.get(target.input) if isinstance(inputs, Mapping) else None


class CommandRegistry:
    """Enabled commands by name, re-read from the database now and then."""

    def __init__(self, store: commands_store.CommandStore, *,
                 refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.store = store
        self.refresh_seconds = refresh_seconds
        self._entries: dict[str, Entry] = {}
        self._workflows: dict[str, workflow.Workflow] = {}
        self._loaded_at = -float("inf")
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Read the commands table again."""
        async with self._lock:
            rows = await self.store.list(enabled_only=True)
            entries: dict[str, Entry] = {}
            for row in rows:
                wf = self._workflows.get(row.hash)
                if wf is None:
                    try:
                        wf = await asyncio.to_thread(row.to_workflow)
                    except workflow.WorkflowError as exc:
                        logger.warning("command /%s is not usable: %s", row.command, exc,
                                       extra={"action": "command_invalid"})
                        continue
                    self._workflows[row.hash] = wf
                entries[row.command] = Entry(row.command, row, wf)
            self._entries = entries
            self._loaded_at = time.monotonic()

    async def follow(self, db: database.Database) -> None:
        """Read the table again each time a process changes it (its NOTIFY), and after a
        lost connection (a change may have been missed), until cancelled."""
        async with db.listen([database.COMMANDS_CHANNEL]) as listener:
            # A change made between the first read and the LISTEN sent no notice to us.
            await self.refresh()
            async for _ in listener:
                await self.refresh()

    async def _fresh(self) -> None:
        if time.monotonic() - self._loaded_at > self.refresh_seconds:
            await self.refresh()

    async def get(self, name: str) -> Entry | None:
        await self._fresh()
        return self._entries.get(name)

    async def all(self) -> list[Entry]:
        await self._fresh()
        return [self._entries[name] for name in sorted(self._entries)]

    async def for_user(self, who: Who) -> list[Entry]:
        """The enabled commands this user may run, by name."""
        return [entry for entry in await self.all() if entry.allows(who)]
