"""`comfyveil jobs`: look at the queue and cancel jobs from the command line.

    comfyveil jobs                 # everyone's recent jobs (the whole queue)
    comfyveil jobs list --user 42  # one user's (0: those queued with `comfyveil submit`)
    comfyveil jobs show JOB_ID     # the full id, or the short one the chat shows (#226bb674)
    comfyveil jobs cancel JOB_ID
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import Any

from comfyveil import cli, config_load
from comfyveil.cli._job_line import CLI_USER_ID, describe_progress
from comfyveil.desk import state as job_state
from comfyveil.errors import UsageError
from comfyveil.store import database, jobs
from comfyveil.store import eta as eta_mod


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "jobs",
        help=cli.SUBCOMMANDS["jobs"],
        description="List recent jobs, show one job, or cancel one.",
    )
    parser.add_argument("--config", type=Path, default=None, metavar="FILE")
    parser.set_defaults(
        handler=list_jobs, user=None, all_users=False, limit=20, status=None
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    listing = actions.add_parser("list", help="recent jobs, newest first")
    listing.add_argument(
        "--user", type=int, default=None,
        help=f"only this user's jobs (a Telegram user id; {CLI_USER_ID}: jobs queued with "
        "`comfyveil submit`); by default every user's",
    )
    listing.add_argument(
        "--all", dest="all_users", action="store_true",
        help="every user's jobs (the default; kept for scripts)",
    )
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--status", choices=[s.value for s in jobs.Status], default=None)
    listing.set_defaults(handler=list_jobs)
    show = actions.add_parser("show", help="one job in detail, with its history")
    show.add_argument("job_id", metavar="ID", help=ID_HELP)
    show.set_defaults(handler=show_job)
    cancel = actions.add_parser("cancel", help="cancel a queued or running job")
    cancel.add_argument("job_id", metavar="ID", help=ID_HELP)
    cancel.set_defaults(handler=cancel_job)
    for sub in (listing, show, cancel):
        sub.add_argument("--config", type=Path, default=argparse.SUPPRESS, metavar="FILE")


ID_HELP = "the job's id, or its first 8 characters as the chat shows them (#226bb674)"
MIN_SHORT_ID = 6  # hex digits: fewer would name many jobs


def parse_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text.strip())
    except ValueError as exc:
        raise UsageError(f"{text[:40]!r} is not a job id") from exc


async def find_id(db: database.Database, text: str) -> uuid.UUID:
    """The job `text` names: a full id, or the short one the chat shows (`#226bb674`)."""
    ref = text.strip().removeprefix("#").replace("-", "").lower()
    if len(ref) == 32:
        return parse_id(ref)
    if len(ref) < MIN_SHORT_ID or any(c not in "0123456789abcdef" for c in ref):
        raise UsageError(
            f"{text[:40]!r} is not a job id: give the id, or its first 8 characters as the "
            "chat shows them (#226bb674)"
        )
    found = await db.jobs.find_by_prefix(ref)
    if not found:
        raise UsageError(f"there is no job {ref}")
    if len(found) > 1:
        raise UsageError(f"more than one job starts with {ref}; give more of its id")
    return found[0].id


async def _open(args: argparse.Namespace) -> database.Database:
    return await database.Database.open(config_load.load(args.config))


def _time(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


async def list_jobs(args: argparse.Namespace) -> int:
    async with await _open(args) as db:
        statuses = [jobs.Status(args.status)] if args.status else None
        if args.user is None or args.all_users:
            found = await db.jobs.list_recent(limit=args.limit, statuses=statuses)
        else:
            found = await db.jobs.list_for_user(args.user, limit=args.limit, statuses=statuses)
    if not found:
        print("no jobs" if args.user is None else f"no jobs of user {args.user}")
        return 0
    print(f"{'ID':36}  {'USER':>12}  {'COMMAND':8}  {'STATUS':9}  {'BACKEND':8}  "
          f"{'TRIES':5}  CREATED")
    for job in found:
        print(f"{job.id!s:36}  {job.user_id:>12}  {job.command:8}  {job.status.value:9}  "
              f"{job.backend or '-':8}  {job.attempts:5}  {_time(job.created_at)}")
    return 0


async def show_job(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    async with await database.Database.open(settings) as db:
        job_id = await find_id(db, args.job_id)
        job = await db.jobs.get(job_id)
        if job is None:
            raise UsageError(f"there is no job {job_id}")
        # The one ETA every front end shows (store/eta.py), for the configured backends.
        up = eta_mod.backends_up(None, settings.backend_list())
        wait = await db.jobs.wait(
            job_id, backends=up, slots=eta_mod.slots_of(settings.backend_list())
        )
        place = wait.place if wait is not None else None
        eta = wait.seconds if wait is not None else None
        history = await db.jobs.events(job_id)
        outputs = await db.jobs.outputs(job_id)
    print(f"job      {job.id}")
    print(f"command  /{job.command}")
    print(f"status   {describe_progress(job, job_state.of(job, place=place))}")
    print(f"backend  {job.backend or '-'}  (attempt {job.attempts} of {job.max_attempts})")
    print(f"created  {_time(job.created_at)}   finished {_time(job.finished_at)}")
    if eta is not None:
        print(f"eta      about {eta:.0f} s")
    if wait is not None and (wait.running or wait.ahead_by_backend):
        names = sorted({*wait.running, *wait.ahead_by_backend})
        split = ", ".join(
            f"{n}: {wait.running.get(n, 0)} running, {wait.ahead_by_backend.get(n, 0)} ahead"
            for n in names
        )
        print(f"gpus     {split}")
    expected = job.progress.get("expected_seconds") if job.progress else None
    if isinstance(expected, int | float):
        print(f"routed   expected done {expected:.1f} s after it was placed on {job.backend}")
    if job.error:
        print(f"error    {job.error}")
    for output in outputs:
        print(f"output   {output.index}: {output.filename} ({output.mime}, {output.size} bytes)")
    for event in history:
        print(f"  {_time(event.at)}  {event.kind:16} {event.status.value}")
    return 0


async def cancel_job(args: argparse.Namespace) -> int:
    async with await _open(args) as db:
        job_id = await find_id(db, args.job_id)
        before = await db.jobs.get(job_id)
        # One that had ended (a cancelled one too) is not "cancelled" now: nothing was done.
        job = before if before is None or before.status.finished else await db.jobs.cancel(
            job_id)
    if job is None:
        raise UsageError(f"there is no job {job_id}")
    if job.status.finished and job is before:
        print(f"comfyveil: job {job_id} had already ended ({job.status.value}); nothing to "
              "cancel", file=sys.stderr)
        return 1
    if job.status is jobs.Status.CANCELLED:
        print(f"job {job_id} cancelled")
    elif job.status is jobs.Status.RUNNING:
        print(f"job {job_id} is running; its worker was asked to stop it")
    else:
        print(f"job {job_id} had already ended ({job.status.value})")
    return 0
