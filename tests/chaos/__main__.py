"""`python -m tests.chaos`: users on every front end while faults strike at random.

    python -m tests.chaos --minutes 60 --seed 7    # make chaos HOURS=1
    python -m tests.chaos --minutes 5              # the soak's version

Prints what was asked and told, the faults by kind, each invariant's violations (with
the job's events), and as its last line one JSON object with the figures. Exit status 1
when any invariant was violated. The same --seed draws the same users and faults.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import random
import signal
import sys
import time
from typing import Any

from tests.chaos import anon as chaos_anon
from tests.chaos import checks
from tests.chaos.faults import Faults
from tests.chaos.system import System
from tests.chaos.users import History, Users

WARM_UP_S = 30.0
SETTLE_S = 240.0
SETTLE_MAX_S = 1800.0
# A process's memory is judged only when it ran this long after its warm-up measure: one
# restarted late is still filling its caches, which is no leak.
RSS_JUDGED_AFTER_S = 120.0


async def _all_settled(system: System, history: History) -> bool:
    """Every chat message answered (a job, or a sentence), every job ended, nothing of
    theirs written down as left on a GPU, and every chat job's result handed to the chat
    (a result finished by a worker of another process reaches the chat through the bot's
    catch-up)."""
    try:
        rows = await system.query(
            "SELECT count(*) AS n FROM jobs j WHERE status IN ('queued', 'running')"
            " OR (status = 'succeeded' AND chat_id > 0 AND NOT EXISTS ("
            "     SELECT 1 FROM deliveries d WHERE d.job_id = j.id AND d.sink = 'telegram'))"
        )
        if rows[0]["n"]:
            return False
        # what jobs left on the GPUs is swept within a minute of their end
        traces = await system.query("SELECT count(*) AS n FROM backend_traces")
        if traces[0]["n"]:
            return False
        prompts = await system.query("SELECT params->>'prompt' AS p FROM jobs")
    except Exception:
        return False
    by_token: dict[str, list[dict[str, Any]]] = {}
    for row in prompts:
        by_token.setdefault((row["p"] or "").split(" ", 1)[0], []).append(row)
    answered = checks.refusals_of(system, history, by_token)
    return all(
        r.token in by_token or r.rid in answered or r.forgotten
        for r in history.requests
        if r.front == "chat"
    )


def _forget_uploads(system: System, since: int) -> int:
    """Drop the bytes of the results the bot uploaded (the checks read the calls' answers,
    not the images): an hour of them would grow this process for nothing. Returns how
    many calls are done."""
    calls = system.telegram.sent
    for call in calls[since:]:
        if call.files:
            call.files = {field: (name, b"") for field, (name, _data) in call.files.items()}
    return len(calls)


async def _open_jobs(system: System) -> int | None:
    with contextlib.suppress(Exception):
        rows = await system.query(
            "SELECT count(*) AS n FROM jobs WHERE status IN ('queued', 'running')"
        )
        return int(rows[0]["n"])
    return None


JOB_TABLES = (
    "jobs",
    "job_events",
    "job_inputs",
    "job_outputs",
    "deliveries",
    "delivery_claims",
    "backend_traces",
    "job_previews",
    "chat_sessions",
    "webhook_jobs",
    "webhook_deliveries",
    "api_requests",
)


RELATION_BYTES = (
    "SELECT n.nspname || '.' || c.relname AS name, pg_relation_size(c.oid) AS n"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relkind IN ('r', 'i', 't', 'm')"
)


async def _relation_bytes(system: System) -> dict[str, int]:
    """Each table's, index's and TOAST table's size (main fork), catalogs included."""
    with contextlib.suppress(Exception):
        return {r["name"]: int(r["n"]) for r in await system.query(RELATION_BYTES)}
    return {}


def _grown(before: dict[str, int], after: dict[str, int], top: int = 8) -> str:
    """The relations that grew most between two measures, for the size's violation."""
    growth = sorted(
        ((after[k] - before.get(k, 0), k) for k in after if after[k] > before.get(k, 0)),
        reverse=True,
    )
    return ", ".join(
        f"{name} {before.get(name, 0) >> 10} -> {after[name] >> 10} KiB"
        for _delta, name in growth[:top]
    )


async def _database_bytes(system: System) -> int:
    with contextlib.suppress(Exception):  # down at that moment: counted as 0
        rows = await system.query("SELECT pg_database_size(current_database()) AS n")
        return int(rows[0]["n"])
    return 0


async def _compaction_done(system: System, timeout: float = 120.0) -> None:
    """Wait until the purge's compaction (a VACUUM and a REINDEX CONCURRENTLY of each job
    table, one statement after another) has ended: measured while it runs, the size would
    count the old and the new indexes both. Done when no such statement was seen running
    at five looks a second apart."""
    started = time.monotonic()
    deadline = started + timeout
    quiet = 0
    seen: set[str] = set()
    while quiet < 5 and time.monotonic() < deadline:
        await asyncio.sleep(1)
        with contextlib.suppress(Exception):
            rows = await system.query(
                "SELECT query, wait_event_type FROM pg_stat_activity WHERE state = 'active'"
                " AND pid <> pg_backend_pid()"
                " AND (query ILIKE 'VACUUM%%' OR query ILIKE 'REINDEX%%'"
                "      OR query ILIKE 'DROP INDEX%%')"
            )
            seen |= {f"{r['query'][:40]} (waiting on {r['wait_event_type']})" for r in rows}
            quiet = 0 if rows else quiet + 1
    # said, so a size after retention measured mid-compaction is not taken for bloat
    state = "ended" if quiet >= 5 else f"STILL RUNNING after {timeout:.0f} s"
    print(
        f"chaos: the purge's compaction {state} ({time.monotonic() - started:.0f} s;"
        f" seen: {sorted(seen)[:6]})",
        flush=True,
    )


async def _retention(system: System, report: checks.Report) -> int:
    """Retention as short as a second, `comfyveil run` started again (it purges at
    start): nothing of any job may be left; the database's size after a VACUUM (what
    autovacuum does) is returned."""
    system.set_retention_days(1 / 86400)
    await asyncio.sleep(2)  # every job ended longer ago than that
    run = system.processes["run"]
    run.held_down = True
    run.signal(signal.SIGTERM)
    await run.wait(30)
    run.start()
    await system.wait_web()
    left: dict[str, int] = {}
    for _ in range(30):
        await asyncio.sleep(2)
        left = {}
        for table in JOB_TABLES:
            rows = await system.query(f"SELECT count(*) AS n FROM {table}")
            if rows[0]["n"]:
                left[table] = rows[0]["n"]
        if not left:
            break
    if left:
        report.add(
            "retention leaves nothing of a job", None, f"rows left a minute after the purge: {left}"
        )
    await _compaction_done(system)
    await system.execute("VACUUM")
    return await _database_bytes(system)


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    system = System(anon=chaos_anon.wanted(), verbose=args.verbose)
    history = History()
    report = checks.Report()
    print(
        f"chaos: seed {args.seed}, {args.minutes} min, {args.rate} requests/s, in {system.tmp}",
        flush=True,
    )
    # Said in every run's output, so that no reader assumes anon was part of a run.
    print(
        f"chaos: anon mode {'ON' if system.anon else 'off'} ({chaos_anon.ENV}=1: one backend"
        " behind a hidden service on a private Anyone network, anon killed and restarted)",
        flush=True,
    )
    await system.start()
    users = Users(system, history, rng)
    every = (args.fault_min, args.fault_max)
    faults = (
        chaos_anon.AnonFaults(system, system.anon, random.Random(args.seed + 1), every=every)
        if system.anon
        else Faults(system, random.Random(args.seed + 1), every=every)
    )
    rss_warm: dict[str, int] = {}
    db_warm = db_end = db_purged = 0
    relations_warm: dict[str, int] = {}
    try:
        await users.prepare()
        started = time.monotonic()
        until = started + args.minutes * 60
        fault_task = asyncio.create_task(faults.run(until))
        warmed = False
        trim_at = time.monotonic() + 60
        trimmed = 0
        while time.monotonic() < until:
            users.one()
            await asyncio.sleep(rng.expovariate(args.rate))
            if not warmed and time.monotonic() - started > WARM_UP_S:
                warmed = True
                rss_warm = {n: p.rss() or 0 for n, p in system.processes.items()}
                db_warm = await _database_bytes(system)
                relations_warm = await _relation_bytes(system)
            for process in system.processes.values():  # a restarted process warms up anew
                process.supervise()
                if process.warm_rss is None and time.monotonic() - process.started_at > WARM_UP_S:
                    process.warm_rss = process.rss()
                    process.warm_at = time.monotonic()
            if time.monotonic() >= trim_at:  # the harness's own memory: no uploaded bytes
                trim_at = time.monotonic() + 60
                trimmed = _forget_uploads(system, trimmed)
        fault_task.cancel()
        await faults.settle()
        print("chaos: faults stopped, settling", flush=True)
        # An hour's run may end with a long queue: the settle goes on while the jobs
        # still open keep getting fewer, SETTLE_S after the last progress (at most
        # SETTLE_MAX_S in all).
        settle_start = time.monotonic()
        deadline = settle_start + SETTLE_S
        fewest: int | None = None
        while time.monotonic() < min(deadline, settle_start + SETTLE_MAX_S):
            for process in system.processes.values():
                process.supervise()
            if not users.tasks and await _all_settled(system, history):
                break
            open_jobs = await _open_jobs(system)
            if open_jobs is not None and (fewest is None or open_jobs < fewest):
                fewest = open_jobs
                deadline = time.monotonic() + SETTLE_S
            await asyncio.sleep(2)
        print(f"chaos: settled in {time.monotonic() - settle_start:.0f} s", flush=True)
        await asyncio.sleep(10)  # deliveries and clean-ups after the last job ends
        rss_end = {n: p.rss() or 0 for n, p in system.processes.items()}
        for name, process in system.processes.items():
            end = rss_end.get(name, 0)
            young = process.warm_at is None or time.monotonic() - process.warm_at < (
                RSS_JUDGED_AFTER_S
            )
            if process.warm_rss and young:
                report.notes[
                    f"{name}: memory not judged (started again too late for a growth to show)"
                ] += 1
            elif process.warm_rss and end > 1.5 * process.warm_rss:
                report.add(
                    "no growing memory",
                    None,
                    f"{name}: {process.warm_rss >> 20} MiB warm, {end >> 20} MiB at the end",
                )
        await checks.check(system, history, report, users.sessions, faults.log)
        if system.anon is not None:
            with contextlib.suppress(Exception):
                report.notes.update(await system.anon.outcomes(system))
        # what every user was told, beside the logs: a violation looked into after the run
        with open(system.tmp / "history.jsonl", "w") as out:
            for request in history.requests:
                out.write(json.dumps(dataclasses.asdict(request)) + "\n")
            for command in history.commands:
                out.write(json.dumps({"command": command}) + "\n")
        db_end = await _database_bytes(system)
        try:
            db_purged = await _retention(system, report)
        except Exception as exc:  # still print what was found
            report.add("retention leaves nothing of a job", None, f"not checked: {exc!r}")
        grown = _grown(relations_warm, await _relation_bytes(system))
        print(f"chaos: relations grown most since warm-up, after retention: {grown}", flush=True)
        if db_warm and db_purged > 1.1 * db_warm:
            report.add(
                "the database's size is back within 10 % after retention",
                None,
                f"{db_warm / 2**20:.1f} MiB after warm-up, {db_purged / 2**20:.1f} MiB after"
                f" the purge and a VACUUM; grown most: {grown}",
            )
    finally:
        await users.close()
        orphans = await system.stop()
    for orphan in orphans:
        report.add("no orphan processes", None, orphan)
    for failure in system.postgres.failures:
        report.add("the run itself held (a harness failure, not the product's)", None, failure)
    if system.anon is not None and system.anon.gpu is not None:
        report.notes.update(system.anon.notes())
    limited = collections.Counter(call.method for call in system.telegram.limited)
    for method, count in limited.items():
        report.notes[f"Bot API calls refused by Telegram's limits (429): {method}"] += count
    for name, process in system.processes.items():
        for exit_line in process.exits:
            report.notes[
                f"{name} exited by itself, started again 5 s later as systemd does: {exit_line}"
            ] += 1

    _print(history, faults, report, rss_warm, (db_warm, db_end, db_purged), args)
    return 1 if report.violations else 0


def _print(
    history: History,
    faults: Faults,
    report: checks.Report,
    rss_warm: dict[str, int],
    db: tuple[int, int, int],
    args: argparse.Namespace,
) -> None:
    db_warm, db_end, db_purged = db
    print("\nrequests (front end: what the user was told)")
    for key, count in sorted(report.outcomes.items()):
        print(f"  {key:28} {count:>6}")
    print(f"  {'all':28} {len(history.requests):>6}")
    print("\njobs (in the database at the check; a /forget deletes its own)")
    for status, count in sorted(report.jobs.items()):
        print(f"  {status:28} {count:>6}")
    print(f"  {'all':28} {sum(report.jobs.values()):>6}")
    print(f"  {'prompts run on the GPUs':28} {report.prompts_run:>6}")
    print("\nfaults")
    for kind, count in sorted(faults.counts().items()):
        print(f"  {kind:28} {count:>6}")
    print(f"  {'all':28} {len(faults.log):>6}")
    for kind, count in sorted(faults.skipped.items()):
        print(f"  (not possible here: {kind} x{count})")
    print("\nnotes")
    for note, count in sorted(report.notes.items()):
        print(f"  {count:>6}  {note}")
    print(
        f"\ndatabase: {db_warm / 2**20:.1f} MiB after warm-up, {db_end / 2**20:.1f} MiB at"
        f" the end, {db_purged / 2**20:.1f} MiB after retention purged every job"
    )
    print(f"\nviolations: {len(report.violations)}")
    by_invariant: dict[str, list[checks.Violation]] = {}
    for violation in report.violations:
        by_invariant.setdefault(violation.invariant, []).append(violation)
    for invariant, found in by_invariant.items():
        print(f"  {invariant}: {len(found)}")
        for violation in found[:10]:
            print(f"    {violation.request}: {violation.detail[:800]}")
    print(
        json.dumps(
            {
                "seed": args.seed,
                "anon": chaos_anon.wanted(),
                "minutes": args.minutes,
                "requests": len(history.requests),
                "jobs": sum(report.jobs.values()),
                "jobs_by_status": dict(report.jobs),
                "prompts_run": report.prompts_run,
                "faults": len(faults.log),
                "faults_by_kind": dict(faults.counts()),
                "violations": len(report.violations),
                "violations_by_invariant": {k: len(v) for k, v in by_invariant.items()},
                "outcomes": dict(report.outcomes),
                "database_mib": [round(b / 2**20, 1) for b in db],
            }
        )
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--hours", type=float, help="instead of --minutes")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--rate", type=float, default=1.5, help="requests a second")
    parser.add_argument("--fault-min", type=float, default=5.0, help="seconds between faults")
    parser.add_argument("--fault-max", type=float, default=15.0)
    parser.add_argument(
        "--verbose", action="store_true", help="the processes under test log at INFO"
    )
    args = parser.parse_args(argv)
    if args.hours is not None:
        args.minutes = args.hours * 60
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
