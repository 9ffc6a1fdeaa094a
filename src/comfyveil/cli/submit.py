"""`comfyveil submit`: put a job in the queue without a chat; optionally wait for it.

    comfyveil submit f an astronaut riding a horse --set steps=4
    comfyveil submit qwen "make it night" --image photo.png --wait --out out/
    comfyveil submit flows/my_flow.toml "a lighthouse" --set steps=8

Prints the job id. With --wait, the id and progress go to stderr and the saved output
paths to stdout, one per line, like `comfyveil generate`. Everything is checked before the job is
queued: an unknown command or a parameter out of bounds is refused (exit 2) and nothing
is written to the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from comfyveil import cli, config, config_load, sinks
from comfyveil import policy as policy_mod
from comfyveil.cli import _run_args
from comfyveil.cli._job_line import CLI_USER_ID, describe_progress
from comfyveil.comfy import workflow
from comfyveil.desk import state as job_state
from comfyveil.desk import submit as desk_submit
from comfyveil.errors import ComfyveilError, UsageError
from comfyveil.store import database, jobs

WAIT_POLL = 1.0  # seconds between looks at the job while waiting, besides NOTIFY


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "submit",
        help=cli.SUBCOMMANDS["submit"],
        description="Queue WORKFLOW (a command such as f, a workflow name, or a path to "
        "your own NAME.toml) with PROMPT and print the job id; with --wait, follow it and "
        "save its outputs into DIR.",
    )
    _run_args.add_workflow_run(parser)
    parser.add_argument("--wait", action="store_true", help="wait for the job to finish")
    _run_args.add_out(parser)
    parser.add_argument("--priority", type=int, default=0, help="higher runs first")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE")
    parser.set_defaults(handler=run)


def check_image(path: Path, settings: config.Settings) -> jobs.InputImage:
    """Read an --image file and check it is an image within the limits. Blocking."""
    checked = _run_args.read_image(path, settings)
    return jobs.InputImage(filename=path.name, mime=checked.mime, data=checked.data)


def _is_path(name: str) -> bool:
    """Whether WORKFLOW names a file (NAME.toml, or anything with a folder in it)."""
    return name.endswith(".toml") or os.sep in name or (os.altsep or os.sep) in name


async def load_path(db: database.Database, name: str) -> workflow.Workflow:
    """The workflow of the submitter's own NAME.toml (and NAME.json beside it), kept in
    the database under its content hash so a worker on any host runs exactly this graph
    and these bindings, whatever a command of the same name holds.

    Raises:
        UsageError: the files are missing or not a valid workflow.
    """
    path = Path(name)
    try:
        wf = await asyncio.to_thread(workflow.load, path)
        toml_text = await asyncio.to_thread(path.read_text, encoding="utf-8")
        graph_text = await asyncio.to_thread(path.with_suffix(".json").read_text, encoding="utf-8")
    except workflow.WorkflowError as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:
        raise UsageError(f"cannot read workflow file {path}: {exc.strerror}") from exc
    await db.commands.save_version(wf, toml_text, graph_text)
    return wf


async def find_command(db: database.Database, name: str) -> workflow.Workflow:
    """The workflow of a command (``f``, ``/f``) or of a workflow name, as stored, or of
    a path to NAME.toml."""
    if _is_path(name):
        return await load_path(db, name)
    await db.commands.seed()
    command = await db.commands.get(name.removeprefix("/"))
    if command is None:
        for candidate in await db.commands.list():
            if candidate.workflow == name:
                command = candidate
                break
    if command is None:
        known = ", ".join(c.command for c in await db.commands.list()) or "none"
        raise UsageError(f"unknown command {name[:60]}; known: {known}")
    if not command.enabled:
        raise UsageError(f"the command /{command.command} is turned off")
    return command.to_workflow()


async def build_job(
    db: database.Database,
    settings: config.Settings,
    name: str,
    prompt: Sequence[str],
    assignments: Sequence[str],
    image_paths: Sequence[Path],
    *,
    priority: int = 0,
) -> jobs.NewJob:
    """Check everything a job needs and describe it; nothing is queued yet.

    Raises:
        UsageError: unknown command, bad parameter, missing or unreadable image, a prompt
            the content policy (``[policy]``) refuses.
    """
    wf = await find_command(db, name)
    values: dict[str, object] = dict(_run_args.parse_assignments(list(assignments)))
    if prompt:
        if wf.prompt_param is None:
            raise UsageError(f"/{wf.command} takes no prompt")
        values[wf.prompt_param] = " ".join(prompt)
    names = wf.image_params
    if len(image_paths) > len(names):
        allowed = "no image" if not names else f"{len(names)} image(s)"
        raise UsageError(f"/{wf.command} takes {allowed}, got {len(image_paths)}")
    skip = {"negative", *names}
    texts = [v for k, v in values.items() if k not in skip and isinstance(v, str)]
    if policy_mod.Policy(settings.policy).refuses(wf.command, texts):
        await db.refusals.count(wf.command)
        raise policy_mod.PromptRefused()
    images = [await asyncio.to_thread(check_image, path, settings) for path in image_paths]
    for param, image in zip(names, images, strict=False):
        values[param] = image.filename
    validated = desk_submit.validate(settings, wf, values)
    for param in names[len(images) :]:
        validated.pop(param, None)  # unbound images are not in the graph's values
    return jobs.NewJob(
        user_id=CLI_USER_ID,
        chat_id=CLI_USER_ID,
        command=wf.command,
        workflow_hash=wf.hash,
        params=validated,
        inputs=images,
        priority=priority,
        max_attempts=settings.worker.max_attempts,
    )


async def wait_for_job(
    db: database.Database, job_id: uuid.UUID, stream: IO[str], poll: float = WAIT_POLL
) -> jobs.Job:
    """Follow a job until it ends, writing progress lines to `stream`."""
    last = ""
    states = job_state.StateMemory()  # a line never goes back to an earlier state
    async with db.listen((database.UPDATES_CHANNEL,)) as listener:
        notes = listener.__aiter__()
        pending: asyncio.Task[Any] | None = None
        try:
            while True:
                job = await db.jobs.get(job_id)
                if job is None:
                    raise ComfyveilError("the job disappeared from the queue")
                if job.status.finished:
                    return job
                ahead = await db.jobs.position(job_id)
                place = None if ahead is None else ahead + 1
                line = describe_progress(job, states.shown(job_id, job_state.of(job, place=place)))
                if line != last:
                    last = line
                    print(line, file=stream, flush=True)
                if pending is None:
                    pending = asyncio.ensure_future(anext(notes))
                done, _ = await asyncio.wait({pending}, timeout=poll)
                if done:
                    pending = None
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending


async def run(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    if args.wait:
        _run_args.check_out(args.out)
    async with await database.Database.open(settings) as db:
        new = await build_job(
            db,
            settings,
            args.workflow,
            args.prompt,
            args.values,
            args.image,
            priority=args.priority,
        )
        job = await db.jobs.enqueue(new)
        if not args.wait:
            print(job.id, flush=True)
            return 0
        # With --wait, stdout carries only the saved paths (like generate).
        print(f"job {job.id}", file=sys.stderr, flush=True)
        finished = await wait_for_job(db, job.id, sys.stderr)
        if finished.status is jobs.Status.CANCELLED:
            raise ComfyveilError("the job was cancelled")
        if finished.status is jobs.Status.FAILED:
            raise ComfyveilError(finished.error or "the job failed")
        outputs = await db.jobs.outputs(job.id)
        saved = await asyncio.to_thread(sinks.write_outputs, args.out, finished, outputs)
        for path in saved:
            print(path)
    return 0
