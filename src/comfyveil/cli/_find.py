"""Finding the workflow a command-line NAME means, as the bot would for `/NAME`: a shipped
workflow, one under `[workflows] dirs`, a NAME.toml path, or else a command the database
holds (`comfyveil workflows add`). `generate`, `bench` and `models check` share it, so a
command that runs in the chat is found by each of them."""

from __future__ import annotations

from collections.abc import Sequence

from comfyveil import config
from comfyveil.comfy import bindings, workflow
from comfyveil.errors import ComfyveilError, UsageError


async def find_workflow(settings: config.Settings, name: str) -> workflow.Workflow:
    """The workflow `name` means (see the module's text).

    Raises:
        UsageError: no file and no stored command has that name (the files' reason).
    """
    return (await find_workflows(settings, [name]))[0]


async def find_workflows(
    settings: config.Settings, names: Sequence[str]
) -> list[workflow.Workflow]:
    """`find_workflow` for each name, asking the database once for those no file has."""
    found: dict[int, workflow.Workflow] = {}
    missing: dict[int, workflow.WorkflowError] = {}
    for index, name in enumerate(names):
        try:
            found[index] = workflow.find(name, extra_dirs=settings.workflow_dirs)
        except workflow.WorkflowError as exc:
            missing[index] = exc
    if missing:
        first = missing[min(missing)]
        # Only a database that exists is asked: a typo must not start an embedded PostgreSQL.
        has_database = settings.database.url is not None or settings.database_dir.is_dir()
        if not has_database or not all(
            bindings.COMMAND_RE.match(names[i].removeprefix("/")) for i in missing
        ):
            raise UsageError(str(first)) from first
        from comfyveil.store import database  # only when the files did not have it

        try:
            async with await database.Database.open(settings) as db:
                for index, exc in missing.items():
                    command = await db.commands.get(names[index].removeprefix("/"))
                    if command is None:
                        raise UsageError(str(exc)) from exc
                    found[index] = command.to_workflow()
        except UsageError:
            raise
        except ComfyveilError:
            raise UsageError(str(first)) from first  # no database to ask: the files' answer
    return [found[i] for i in range(len(names))]
