"""`comfyveil models`: the model files of a command, checked and installed on a GPU host.

    comfyveil models check [COMMAND...] --comfyui-dir DIR [--verify]
    comfyveil models check [COMMAND...] --server URL
    comfyveil models install COMMAND... --comfyui-dir DIR [--quiet] [--via-anon]

A COMMAND is a shipped command's name (``f``, ``wan``) or the path of a workflow's
NAME.toml; its ``[[models]]`` tables say which files it needs, from which Hugging Face
repository and commit, and their size and sha256. No database: this runs where ComfyUI
runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

from comfyveil import cli, config, config_load
from comfyveil.cli import _find
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import manifest, workflow
from comfyveil.comfy.requirements import FOLDER_ALIASES
from comfyveil.errors import UsageError
from comfyveil.models import hub, local

T = TypeVar("T")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "models", help=cli.SUBCOMMANDS["models"],
        description="Check and install the model files of commands on a GPU host.",
    )
    actions = parser.add_subparsers(dest="models_action", metavar="ACTION", required=True)

    check = actions.add_parser(
        "check", help="say which model files each command has, lacks, or has wrong",
        description="Per command, each model file: present, missing, or present with the "
        "wrong size (or hash, with --verify). Exits 1 when a file is not in place.",
    )
    check.add_argument("commands", nargs="*", metavar="COMMAND",
                       help="a command (f, wan) or a NAME.toml; default: every one")
    where = check.add_mutually_exclusive_group(required=True)
    where.add_argument("--comfyui-dir", type=Path, metavar="DIR",
                       help="the ComfyUI folder (the one holding models/)")
    where.add_argument("--server", metavar="URL",
                       help="ask this running ComfyUI which files it sees instead")
    check.add_argument("--verify", action="store_true",
                       help="hash every file (reads all of them: minutes for large ones)")
    check.add_argument("--config", type=Path, default=None, metavar="FILE")
    check.set_defaults(handler=check_models)

    install = actions.add_parser(
        "install", help="download the missing model files, verified",
        description="Download what the commands' model files lack from the Hugging Face "
        "hub (HF_ENDPOINT for a mirror), check each one's sha256, then move it into "
        "place. Free disk space is checked first; an interrupted download resumes.",
    )
    install.add_argument("commands", nargs="+", metavar="COMMAND",
                         help="a command (f, wan) or a NAME.toml")
    install.add_argument("--comfyui-dir", type=Path, metavar="DIR", required=True,
                         help="the ComfyUI folder (the one holding models/)")
    install.add_argument("--quiet", action="store_true",
                         help="no progress bars and no report; errors only")
    install.add_argument("--via-anon", action="store_true",
                         help="download through the Anyone network, so the hub does not "
                         "learn which host fetches what")
    install.add_argument("--config", type=Path, default=None, metavar="FILE")
    install.set_defaults(handler=install_models)


async def _workflows(
    names: Sequence[str], settings: config.Settings
) -> list[workflow.Workflow]:
    """Every shipped workflow and those under `[workflows] dirs`, or the ones named: a
    shipped name, a file, or a command added with `comfyveil workflows add`."""
    if names:
        found: dict[str, workflow.Workflow] = {}
        for wf in await _find.find_workflows(settings, names):
            found.setdefault(wf.name, wf)
        return list(found.values())
    try:
        known = workflow.shipped()
        for directory in settings.workflow_dirs:
            known.update(workflow.load_dir(directory))
    except workflow.WorkflowError as exc:
        raise UsageError(str(exc)) from exc
    return sorted(known.values(), key=lambda w: w.command)


def _unlisted(wf: workflow.Workflow) -> list[str]:
    """Files the graph loads that no [[models]] table names (to install by hand)."""
    listed = {(m.folder, m.filename) for m in wf.models}
    for model in wf.models:
        for alias in FOLDER_ALIASES.get(model.folder, ()):
            listed.add((alias, model.filename))
    return [f"{folder}/{name}" for folder, name in wf.required_models()
            if (folder, name) not in listed]


def _label(wf: workflow.Workflow) -> str:
    return f"/{wf.command}  ({wf.source.name if wf.source else wf.name})"


def _command_word(wf: workflow.Workflow) -> str:
    """How to name it on the command line: a shipped command by name, others by path."""
    if wf.name in workflow.shipped() and workflow.shipped()[wf.name] == wf:
        return wf.command
    return str(wf.source) if wf.source else wf.command


async def check_models(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    workflows = await _workflows(args.commands, settings)
    if args.server and args.verify:
        raise UsageError("--verify reads the files, so it needs --comfyui-dir, not --server")
    if args.server:
        return await _check_server(args.server, workflows)
    models = local.models_dir(args.comfyui_dir)
    worst = 0
    for wf in workflows:
        print(_label(wf))
        states = []
        for model in wf.models:
            with _hash_progress(model, enabled=args.verify) as on_bytes:
                state = await _in_thread(
                    local.inspect, models, model, verify=args.verify, on_bytes=on_bytes
                )
            states.append(state)
            print("  " + _state_line(state))
        for relative in _unlisted(wf):
            folder, _sep, name = relative.partition("/")
            there = any((models / alias / name).is_file()
                        for alias in FOLDER_ALIASES.get(folder, (folder,)))
            print(f"  {'present' if there else 'missing':<10} {relative}  (no [[models]] "
                  "table: install it by hand)")
            worst = worst or (0 if there else 1)
        if not wf.models:
            print("  no [[models]] tables in its NAME.toml")
            continue
        todo = [s for s in states if not s.ok]
        if todo:
            worst = 1
            size = local.human_size(sum(s.model.size for s in todo))
            files = "1 file" if len(todo) == 1 else f"{len(todo)} files"
            print(f"  {files} to install ({size}): "
                  + local.install_command([_command_word(wf)], args.comfyui_dir))
        else:
            print("  the file is in place" if len(states) == 1
                  else f"  all {len(states)} files in place")
    return worst


def _state_line(state: local.FileState) -> str:
    model = state.model
    size = local.human_size(model.size)
    if state.state == local.PRESENT:
        checked = "  sha256 ok" if state.sha256 else ""
        return f"{'present':<10} {model.relative}  {size}{checked}"
    if state.state == local.WRONG_SIZE:
        return (f"{'wrong size':<10} {state.path}: {state.size} bytes, expected "
                f"{model.size}")
    if state.state == local.WRONG_HASH:
        return (f"{'wrong hash':<10} {state.path}: sha256 {state.sha256}, expected "
                f"{model.sha256}")
    resume = (f"  ({local.human_size(state.partial)} downloaded; install resumes)"
              if state.partial else "")
    return f"{'missing':<10} {model.relative}  {size}{resume}"


async def _check_server(url: str, workflows: Sequence[workflow.Workflow]) -> int:
    """Ask a running ComfyUI for its model lists (it sees names, not sizes)."""
    lists: dict[str, set[str]] = {}
    worst = 0
    try:
        async with comfy_client.ComfyClient(url, name="server") as client:
            for wf in workflows:
                print(_label(wf))
                wanted = [(m.folder, m.filename) for m in wf.models]
                wanted += [tuple(r.split("/", 1)) for r in _unlisted(wf)]  # type: ignore[misc]
                missing = 0
                for folder, name in wanted:
                    seen = False
                    for alias in FOLDER_ALIASES.get(folder, (folder,)):
                        if alias not in lists:
                            lists[alias] = set(await client.models(alias))
                        seen = seen or name in lists[alias]
                    missing += 0 if seen else 1
                    print(f"  {'present' if seen else 'missing':<10} {folder}/{name}")
                if missing:
                    worst = 1
                    print(f"  {missing} missing; on the GPU host: "
                          + local.install_command([_command_word(wf)]))
    except comfy_errors.ComfyError as exc:
        raise cli.ComfyveilError(str(exc)) from exc
    return worst


async def install_models(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    workflows = await _workflows(args.commands, settings)
    bare = [f"/{wf.command}" for wf in workflows if not wf.models]
    if bare:
        raise UsageError(f"{', '.join(bare)} lists no model files ([[models]] tables in its "
                         "NAME.toml): nothing to install from it")
    try:
        files = manifest.dedupe([wf.models for wf in workflows])
    except manifest.ManifestError as exc:
        raise UsageError(str(exc)) from exc
    models = local.models_dir(args.comfyui_dir)
    states = [local.inspect(models, model) for model in files]
    for state in states:
        if state.state == local.WRONG_SIZE:
            raise UsageError(
                f"{state.path} is there but is {state.size} bytes, not {state.model.size}: "
                "it is another file; move it away or delete it, then run this again"
            )
    names = ", ".join(f"/{wf.command}" for wf in workflows)
    missing = [s for s in states if s.state == local.MISSING]
    if not missing:
        if not args.quiet:
            total = local.human_size(sum(s.model.size for s in states))
            what = ("the model file" if len(states) == 1
                    else f"the {len(states)} model files")
            print(f"nothing to do: {what} of {names} {'is' if len(states) == 1 else 'are'} "
                  f"in place ({total})")
        return 0
    problem = local.space_problem(missing)
    if problem:
        raise local.NotEnoughSpace(problem)
    token = hub.read_token()
    started = time.monotonic()
    if args.via_anon:
        await _install_via_anon(args, settings, missing, token)
    else:
        with hub.session(None):
            await _download_all(missing, token, quiet=args.quiet)
    if not args.quiet:
        size = local.human_size(sum(s.model.size for s in missing))
        seconds = f"{time.monotonic() - started:.0f} s"
        if len(missing) < len(states):
            print(f"installed {len(missing)} of the {len(states)} model files of {names} "
                  f"({size}) in {seconds}; the others were in place")
        else:
            what = ("the model file" if len(states) == 1
                    else f"the {len(states)} model files")
            print(f"installed {what} of {names} ({size}) in {seconds}")
        print(SEEN_WHEN)
    return 0


# This runs on the GPU host, with no line to the running service: say when it notices.
SEEN_WHEN = ("comfyveil uses them at once for a job that needs them and after an admin's "
             "/backends (or the web's backends page); /help and the menu offer them within "
             "5 minutes")


async def _install_via_anon(
    args: argparse.Namespace, settings: config.Settings, missing: list[local.FileState],
    token: str | None,
) -> None:
    from comfyveil.anyone import runtime

    def progress(percent: int, summary: str) -> None:
        if not args.quiet:
            print(f"anon: {percent}% {summary}", file=sys.stderr)

    async with runtime.anon_for(
        settings, [], also=["model downloads (--via-anon)"], on_progress=progress
    ) as router:
        assert router.anon is not None
        with hub.session(router.anon.socks_url("models")):
            await _download_all(missing, token, quiet=args.quiet)


async def _download_all(missing: list[local.FileState], token: str | None, *,
                        quiet: bool) -> None:
    with _download_progress(missing, quiet=quiet) as bars:
        for state in missing:
            on_bytes = bars(state)
            await _in_thread(hub.download, state.model, state.path, token=token,
                             on_bytes=on_bytes)
            if not quiet:
                print(f"placed {state.path} (sha256 checked)", file=sys.stderr)


@contextmanager
def _download_progress(
    missing: list[local.FileState], *, quiet: bool
) -> Iterator[Callable[[local.FileState], Callable[[int], None] | None]]:
    """One bar per file and one for the total, as pip draws them (stderr)."""
    if quiet:
        yield lambda state: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), transient=False,
    )
    total = progress.add_task("total", total=sum(s.model.size for s in missing))

    def bar(state: local.FileState) -> Callable[[int], None]:
        task = progress.add_task(state.model.filename, total=state.model.size)

        def advance(count: int) -> None:
            progress.advance(task, count)
            progress.advance(total, count)

        return advance

    with progress:
        yield bar


@contextmanager
def _hash_progress(model: manifest.ModelFile, *, enabled: bool) -> Iterator[
        Callable[[int], None] | None]:
    if not enabled or not sys.stderr.isatty():
        with nullcontext():
            yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    progress = Progress(TextColumn("sha256 {task.description}"), BarColumn(),
                        DownloadColumn(), console=Console(stderr=True), transient=True)
    task = progress.add_task(model.filename, total=model.size)
    with progress:
        yield lambda count: progress.advance(task, count)


async def _in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking work in a daemon thread: Ctrl-C ends the command at once, leaving a
    partial download to resume (an executor thread would be waited for at exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result = function(*args, **kwargs)
        except BaseException as exc:  # handed to the awaiting task
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="comfyveil-models", daemon=True).start()
    return await future
