"""`comfyveil workflows`: the chat commands and the workflows behind them.

    comfyveil workflows list                 every command in the database
    comfyveil workflows add my_flow.toml     an operator's workflow (my_flow.json beside it);
                                             --replace to replace a command of the same name
    comfyveil workflows enable f | disable f | remove my
    comfyveil workflows check [--server URL] which backend lacks which node or model

The mapping lives in PostgreSQL, so every bot and worker sees the same commands. The
shipped workflows are seeded at each start; an operator's command of the same name
wins over a shipped one.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from comfyveil import cli, config, config_load
from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import notrace, workflow
from comfyveil.errors import ComfyveilError, UsageError
from comfyveil.store import commands as commands_store
from comfyveil.store import database

ROLES = commands_store.DEFAULT_ROLES


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "workflows", help=cli.SUBCOMMANDS["workflows"],
        description="Manage the chat commands and the ComfyUI workflows behind them.",
    )
    # `comfyveil workflows` alone lists them, like `comfyveil jobs`.
    parser.add_argument("--config", type=Path, default=None, metavar="FILE")
    parser.set_defaults(handler=list_commands)
    actions = parser.add_subparsers(dest="workflows_action", metavar="ACTION")

    def action(name: str, handler: Any, text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        sub.add_argument("--config", type=Path, default=argparse.SUPPRESS, metavar="FILE")
        sub.set_defaults(handler=handler)
        return sub

    action("list", list_commands, "list every command with its workflow and state")
    add = action("add", add_workflow, "add an operator's workflow (NAME.toml, NAME.json beside)")
    add.add_argument("toml", type=Path, metavar="NAME.toml")
    add.add_argument("--disabled", action="store_true", help="add it switched off")
    add.add_argument(
        "--admins-only", action="store_true", help="only admins may use the command"
    )
    add.add_argument("--replace", action="store_true",
                     help="replace the command of the same name (shipped or added before)")
    for name, handler, text in (
        ("enable", enable, "let users run a command"),
        ("disable", disable, "stop users from running a command"),
        ("remove", remove, "delete an operator's command"),
    ):
        sub = action(name, handler, text)
        sub.add_argument("command", metavar="COMMAND")
    check = action("check", check_backends, "show what each backend lacks for each command")
    check.add_argument("--server", action="append", default=[], metavar="URL",
                       help="check this ComfyUI server instead of the configured backends")


@asynccontextmanager
async def _open(args: argparse.Namespace) -> AsyncIterator[database.Database]:
    settings = config_load.load(args.config)
    db = await database.Database.open(settings)
    try:
        await db.commands.seed()
        yield db
    finally:
        await db.close()


async def list_commands(args: argparse.Namespace) -> int:
    async with _open(args) as db:
        commands = await db.commands.list()
    width = max((len(c.command) for c in commands), default=4) + 1
    for c in commands:
        state = "enabled " if c.enabled else "disabled"
        roles = "" if set(c.allowed_roles) >= set(ROLES) else " (admins only)"
        print(f"/{c.command:<{width}} {state}  {c.kind:<5}  {c.title} [{c.source}]{roles}")
    return 0


async def add_workflow(args: argparse.Namespace) -> int:
    try:
        wf = workflow.load(args.toml)
    except workflow.WorkflowError as exc:
        raise UsageError(str(exc)) from exc
    graph_text = args.toml.with_suffix(".json").read_text(encoding="utf-8")
    async with _open(args) as db:
        existing = await db.commands.get(wf.command)
        same = existing is not None and (existing.hash, existing.source) == (wf.hash, "operator")
        if existing is not None and not args.replace and not same:
            raise UsageError(
                f"/{existing.command} already runs {_what(existing)}; "
                "add --replace to replace it"
            )
        added = await db.commands.add(
            wf, args.toml.read_text(encoding="utf-8"), graph_text,
            enabled=not args.disabled,
            allowed_roles=("admin",) if args.admins_only else ROLES,
        )
    state = "enabled" if added.enabled else "disabled"
    replaced = f", replacing {_what(existing)}" if existing is not None and not same else ""
    print(f"/{added.command} -> {added.workflow} ({state}){replaced}")
    for line in seed_lines(wf):
        print(f"  {line}")
    return 0


def seed_lines(wf: workflow.Workflow) -> list[str]:
    """Which option is the workflow's seed, and a warning for each sampler seed that no
    option sets (every run with the same options would repeat the same image, which
    ComfyUI answers from its cache)."""
    lines = []
    seeds = wf.seed_params
    for name in seeds:
        p = wf.params[name]
        where = ", ".join(f"node {t.node} {t.input}" for t in p.targets)
        note = ""
        if p.default is not None:
            note = "; its default is not used: each run draws a new seed"
        lines.append(f"seed: --{name} ({where}){note}")
        if name != "seed":
            lines.append(
                f"note: the chat and the web show, fix and re-roll an option called seed; "
                f"rename --{name} to seed for its re-roll buttons"
            )
    if not seeds:
        lines.append("seed: none")
    for node, class_type, input_name in wf.fixed_seeds():
        lines.append(
            f"warning: {class_type} (node {node}) takes its {input_name} from no option: "
            + ("every run with the same options gives the same image"
               if not seeds else "that sampler's noise is the same in every run")
            + f"; bind it with [params.seed] node = \"{node}\", input = \"{input_name}\", "
            'type = "seed"'
        )
    return lines


def _what(command: commands_store.Command) -> str:
    """A command's workflow as an operator recognises it: its name, title and origin."""
    return f"{command.workflow} ({command.title}, {command.source})"


async def _set_enabled(args: argparse.Namespace, enabled: bool) -> int:
    async with _open(args) as db:
        try:
            command = await db.commands.set_enabled(args.command, enabled)
        except commands_store.CommandNotFound as exc:
            raise UsageError(str(exc)) from exc
    print(f"/{command.command} is {'enabled' if command.enabled else 'disabled'}")
    return 0


async def enable(args: argparse.Namespace) -> int:
    return await _set_enabled(args, True)


async def disable(args: argparse.Namespace) -> int:
    return await _set_enabled(args, False)


async def remove(args: argparse.Namespace) -> int:
    async with _open(args) as db:
        existing = await db.commands.get(args.command)
        if existing is None:
            raise UsageError(f"there is no command /{args.command.removeprefix('/')}")
        if existing.source == "shipped":
            raise UsageError(
                f"/{existing.command} is shipped with comfyveil; disable it instead"
            )
        await db.commands.remove(args.command)
    print(f"/{existing.command} removed")
    return 0


async def check_backends(args: argparse.Namespace) -> int:
    """Ask every backend for its nodes and models; exit 1 when one can't run a command."""
    settings = config_load.load(args.config)
    backends = (
        [config.BackendConfig(name=f"server{i}", url=u) for i, u in enumerate(args.server)]
        if args.server else list(settings.backend_list())
    )
    if not backends:
        raise UsageError("no backends to check: name one with --server URL or in [backends]")
    workflows, worst = await _workflows_to_check(args, settings)
    width = max((len(wf.command) for wf, _ in workflows), default=4) + 1
    for backend in backends:
        try:
            # Imported here: aiohttp alone is a third of the other subcommands' start-up.
            from comfyveil.comfy import client as comfy_client

            async with comfy_client.ComfyClient(backend.url, name=backend.name) as client:
                info = await client.object_info()
        except comfy_errors.ComfyError as exc:
            print(f"{backend.name}: {exc}")
            worst = 1
            continue
        for wf, label in workflows:
            problems = wf.check(info)
            verdict = "ok" if not problems else "; ".join(problems)
            print(f"{backend.name}  /{wf.command:<{width}} {verdict}{label}"
                  f"{_trace_note(wf, info, backend)}")
            worst = worst or (1 if problems else 0)
    # Not a backend's problem, so it does not change the exit code.
    for wf, label in workflows:
        for line in seed_lines(wf):
            print(f"/{wf.command:<{width}} {line}{label}")
    return worst


async def _workflows_to_check(
    args: argparse.Namespace, settings: config.Settings
) -> tuple[list[tuple[workflow.Workflow, str]], int]:
    """What the bot serves (every command in the database, operators' ones included, the
    disabled ones marked) and the `[workflows] dirs` that `generate` reads; 1 as the
    second value when the database could not be read, so the exit code stays honest."""
    found: dict[str, tuple[workflow.Workflow, str]] = {}
    worst = 0
    try:
        async with _open(args) as db:
            commands = await db.commands.list()
    except ComfyveilError as exc:
        print(f"database: {exc}; checking only the shipped workflows")
        commands, worst = [], 1
        found = {wf.command: (wf, "") for wf in workflow.shipped().values()}
    for command in commands:
        try:
            wf = command.to_workflow()
        except workflow.WorkflowError as exc:
            print(f"/{command.command}: its stored workflow no longer loads: {exc}")
            worst = 1
            continue
        found[command.command] = (wf, "" if command.enabled else " (disabled)")
    for directory in settings.workflow_dirs:
        for wf in workflow.load_dir(directory).values():
            same = found.get(wf.command)
            if same is None or same[0].hash != wf.hash:
                key = wf.command if same is None else f"{wf.command} {directory}"
                found[key] = (wf, f" ({directory})")
    return list(found.values()), worst


def _trace_note(
    wf: workflow.Workflow, info: Mapping[str, Any], backend: config.BackendConfig
) -> str:
    """What a no-trace backend cannot keep off its disk for this workflow (not an error)."""
    if not backend.no_trace:
        return ""
    notes = [
        f"{kind} (node {node}) has no in-memory equivalent: its file is written to the "
        "GPU host's output folder and overwritten once downloaded"
        for node, kind in notrace.file_writers(wf.graph)
    ]
    memory = notrace.mode(backend.no_trace) == "memory"
    if memory and notrace.WEBSOCKET_SAVER not in info and notrace.to_websocket(wf.graph)[1]:
        notes.append(f"{notrace.WEBSOCKET_SAVER} is missing: images are written to the "
                     "GPU host's disk and overwritten once downloaded")
    return "".join(f"\n    no trace: {note}" for note in notes)
