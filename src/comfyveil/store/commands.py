"""Chat commands: which workflow each command runs, who may use it, on or off.

Seeded from the shipped workflows (`comfyveil.comfy.workflow.shipped()`); operators add
their own. The stored TOML and graph texts are the command's definition, so every
process (bot, workers on other hosts) runs the same workflow.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from comfyveil.store import errors
from comfyveil.store.connector import Connector, Row

if TYPE_CHECKING:
    from comfyveil.comfy import workflow

logger = logging.getLogger(__name__)

DEFAULT_ROLES: tuple[str, ...] = ("user", "admin")


class CommandNotFound(errors.StoreError):
    """There is no such command."""


@dataclass(frozen=True)
class Command:
    command: str  # without the slash
    workflow: str
    title: str
    description: str
    kind: str
    toml: str
    graph: str
    enabled: bool
    allowed_roles: tuple[str, ...]
    limits: dict[str, Any]
    hash: str
    source: str  # shipped | operator
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def from_row(cls, row: Row) -> Command:
        return cls(
            command=row["command"], workflow=row["workflow"], title=row["title"],
            description=row["description"], kind=row["kind"], toml=row["toml"],
            graph=row["graph"], enabled=row["enabled"],
            allowed_roles=tuple(row["allowed_roles"]), limits=row["limits"], hash=row["hash"],
            source=row["source"], created_at=row["created_at"], updated_at=row["updated_at"],
        )

    def allows(self, role: str) -> bool:
        return self.enabled and role in self.allowed_roles

    def to_workflow(self) -> workflow.Workflow:
        """The stored definition parsed back into a Workflow."""
        from comfyveil.comfy import workflow

        return workflow.loads(self.workflow, self.toml, self.graph)


def _texts(wf: workflow.Workflow) -> tuple[str, str]:
    if wf.source is None:
        raise errors.StoreError(
            f"workflow {wf.name} has no source file; add it with its TOML and graph texts"
        )
    toml_path = wf.source
    return (
        toml_path.read_text(encoding="utf-8"),
        toml_path.with_suffix(".json").read_text(encoding="utf-8"),
    )


def _fields(wf: workflow.Workflow, toml_text: str, graph_text: str) -> dict[str, Any]:
    return {
        "command": wf.command, "workflow": wf.name, "title": wf.title,
        "description": wf.description, "kind": wf.kind, "toml": toml_text,
        "graph": graph_text, "hash": wf.hash,
    }


class CommandStore:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.db = Connector(pool)

    async def seed(self, workflows: Iterable[workflow.Workflow] | None = None) -> int:
        """Add or refresh shipped commands; the number added or changed.

        An operator's command of the same name is left alone, and so is the enabled flag
        of an existing command (an operator may have turned it off).
        """
        if workflows is None:
            from comfyveil.comfy import workflow

            workflows = workflow.shipped().values()
        changed = 0
        async with self.db.session(transaction=True) as s:
            for wf in workflows:
                toml_text, graph_text = _texts(wf)
                if await s.one("upsert_shipped_command", **_fields(wf, toml_text, graph_text)):
                    changed += 1
        if changed:
            logger.info("commands seeded", extra={"action": "commands_seeded", "count": changed})
            await self._changed("")
        return changed

    async def _changed(self, command: str) -> None:
        """NOTIFY the processes that offer commands (bots, web servers): a change made here
        reaches them at once, not at their next periodic re-read."""
        await self.db.one("notify_commands_changed", command=command)

    async def add(
        self,
        wf: workflow.Workflow,
        toml_text: str,
        graph_text: str,
        *,
        enabled: bool = True,
        allowed_roles: Sequence[str] = DEFAULT_ROLES,
        limits: Mapping[str, Any] | None = None,
    ) -> Command:
        """Add (or replace) an operator's command built from their own workflow."""
        row = await self.db.one(
            "upsert_operator_command", **_fields(wf, toml_text, graph_text), enabled=enabled,
            allowed_roles=list(allowed_roles), limits=Jsonb(dict(limits or {})),
        )
        assert row is not None
        await self._changed(wf.command)
        return Command.from_row(row)

    async def save_version(self, wf: workflow.Workflow, toml_text: str, graph_text: str) -> None:
        """Keep the texts of a workflow that a job names by its hash but no command holds
        (`comfyveil submit path/NAME.toml`), so any worker can run that exact graph."""
        await self.db.run("save_workflow_version", hash=wf.hash, workflow=wf.name,
                          toml=toml_text, graph=graph_text)

    async def version(self, workflow_hash: str) -> workflow.Workflow | None:
        """The workflow kept under `workflow_hash` by `save_version`, or None.

        Raises:
            WorkflowError: the stored texts no longer load or hash the same (a newer
                comfyveil reads bindings differently): better refused than run changed.
        """
        from comfyveil.comfy import workflow

        row = await self.db.one("get_workflow_version", hash=workflow_hash)
        if row is None:
            return None
        wf = workflow.loads(row["workflow"], row["toml"], row["graph"])
        if wf.hash != workflow_hash:
            raise workflow.WorkflowError(
                f"the stored workflow {row['workflow']} no longer reads as it was queued"
            )
        return wf

    async def set_enabled(self, command: str, enabled: bool) -> Command:
        row = await self.db.one(
            "set_command_enabled", command=command.removeprefix("/"), enabled=enabled
        )
        if row is None:
            raise CommandNotFound(f"there is no command /{command.removeprefix('/')}")
        await self._changed(row["command"])
        return Command.from_row(row)

    async def get(self, command: str) -> Command | None:
        row = await self.db.one("get_command", command=command.removeprefix("/"))
        return Command.from_row(row) if row else None

    async def list(self, *, enabled_only: bool = False) -> list[Command]:
        rows = await self.db.all("list_commands", enabled_only=enabled_only)
        return [Command.from_row(row) for row in rows]

    async def remove(self, command: str) -> bool:
        removed = await self.db.one("delete_command", command=command.removeprefix("/"))
        if removed is not None:
            await self._changed(removed["command"])
        return removed is not None
