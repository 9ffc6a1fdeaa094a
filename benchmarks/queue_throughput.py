"""Queue throughput: claim + complete jobs per second with 1 and 4 workers.

    .venv/bin/python benchmarks/queue_throughput.py [--jobs 400] [--rounds 3]

comfyveil's claim (`FOR UPDATE SKIP LOCKED`, round-robin between users, priorities, a
lease, an event row and NOTIFY) and complete are measured side by side, on the same
PostgreSQL server, with the same number of jobs and the same concurrency, against:

- procrastinate (the `bench` extra: `pip install .[bench]`): its own schema, jobs deferred
  with its JobManager, then each worker loops over its `fetch_job` + `finish_job` (the
  worker's claim and complete path, through its PsycopgConnector) with a no-op task.
  When procrastinate is not importable, that row is printed as skipped.
- a naive loop: `SELECT ... FOR UPDATE` without SKIP LOCKED, where concurrent workers
  queue up behind the same row lock.

Queueing the jobs is not timed, only draining them. Each figure is the median of
`--rounds` runs, interleaved so the systems share the same conditions. No GPU is
involved: this is the database's side of the queue alone.
Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.database import open_for_the_database_user

from comfyveil.store import database, embedded, jobs

try:
    import procrastinate
    from procrastinate import jobs as procrastinate_jobs
except ImportError:  # the optional `bench` extra is not installed
    procrastinate = None  # type: ignore[assignment]
    procrastinate_jobs = None  # type: ignore[assignment]

WORKERS = (1, 4)
USERS = 8  # comfyveil's jobs are spread over users, so round-robin has work to do

NAIVE_CLAIM = """
UPDATE jobs SET status = 'running', attempts = attempts + 1, lease_owner = %(worker)s,
       lease_expires_at = now() + interval '30 seconds', started_at = now()
WHERE id = (SELECT id FROM jobs WHERE status = 'queued'
            ORDER BY priority DESC, created_at, id LIMIT 1 FOR UPDATE)
RETURNING id
"""
NAIVE_COMPLETE = """
UPDATE jobs SET status = 'succeeded', finished_at = now(), lease_owner = NULL
WHERE id = %(id)s AND lease_owner = %(worker)s
"""

# One system: prepare(url, workers, count) -> (drain() -> jobs done, close()).
Drain = Callable[[], Awaitable[int]]
Close = Callable[[], Awaitable[None]]
System = Callable[[str, int, int], Awaitable[tuple[Drain, Close]]]


async def _comfyveil_db(url: str, workers: int, count: int) -> database.Database:
    db = await database.Database.open(url=url, run_migrations=False, max_size=workers + 2)
    async with db.pool.connection() as conn:
        await conn.execute("TRUNCATE jobs, queue_turns CASCADE")
    for i in range(count):
        await db.jobs.enqueue(jobs.NewJob(user_id=1 + i % USERS, chat_id=1, command="f",
                                          workflow_hash="bench", params={"i": i}))
    async with db.pool.connection() as conn:
        await conn.execute("VACUUM ANALYZE jobs")
    return db


async def ours(url: str, workers: int, count: int) -> tuple[Drain, Close]:
    db = await _comfyveil_db(url, workers, count)

    async def loop(name: str) -> int:
        done = 0
        while (job := await db.jobs.claim(name)) is not None:
            await db.jobs.complete(job, [])
            done += 1
        return done

    async def drain() -> int:
        return sum(await asyncio.gather(*(loop(f"w{i}") for i in range(workers))))

    return drain, db.close


async def naive(url: str, workers: int, count: int) -> tuple[Drain, Close]:
    db = await _comfyveil_db(url, workers, count)

    async def loop(name: str) -> int:
        done = 0
        while True:
            async with db.pool.connection() as conn:
                row = await (await conn.execute(NAIVE_CLAIM, {"worker": name})).fetchone()
                if row is None:
                    return done
                await conn.execute(NAIVE_COMPLETE, {"id": row["id"], "worker": name})
            done += 1

    async def drain() -> int:
        return sum(await asyncio.gather(*(loop(f"n{i}") for i in range(workers))))

    return drain, db.close


async def theirs(url: str, workers: int, count: int) -> tuple[Drain, Close]:
    assert procrastinate is not None and procrastinate_jobs is not None
    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=workers + 2)
    await connector.open_async()
    app = procrastinate.App(connector=connector)
    manager = app.job_manager
    admin = await database.connect(url)  # autocommit, for TRUNCATE and VACUUM
    await admin.execute("TRUNCATE procrastinate_jobs, procrastinate_workers CASCADE")
    for i in range(count):  # one defer per job, as a front end would
        await manager.defer_job_async(procrastinate_jobs.Job(
            queue="default", lock=None, queueing_lock=None, task_name="noop",
            task_kwargs={"i": i},
        ))
    await admin.execute("VACUUM ANALYZE procrastinate_jobs")
    await admin.close()

    async def loop() -> int:
        worker_id = await manager.register_worker()
        done = 0
        try:
            while (job := await manager.fetch_job(queues=None, worker_id=worker_id)) is not None:
                await manager.finish_job(
                    job, procrastinate_jobs.Status.SUCCEEDED, delete_job=False
                )
                done += 1
        finally:
            await manager.unregister_worker(worker_id)
        return done

    async def drain() -> int:
        return sum(await asyncio.gather(*(loop() for _ in range(workers))))

    return drain, connector.close_async


async def measure(system: System, url: str, workers: int, count: int) -> float:
    drain, close = await system(url, workers, count)
    try:
        started = time.perf_counter()
        done = await drain()
        elapsed = time.perf_counter() - started
    finally:
        await close()
    if done != count:
        raise RuntimeError(f"{done} of {count} jobs processed")
    return count / elapsed


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    # procrastinate warns that its App is made in __main__; harmless for a benchmark
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    systems: dict[str, System] = {"comfyveil": ours, "naive": naive}
    procrastinate_version: str | None = None
    if procrastinate is not None:
        systems["procrastinate"] = theirs
        procrastinate_version = importlib.metadata.version("procrastinate")
    samples: dict[str, dict[int, list[float]]] = {
        name: {w: [] for w in WORKERS} for name in systems
    }
    with tempfile.TemporaryDirectory(prefix="comfyveil-bench-") as tmpdir:
        open_for_the_database_user(Path(tmpdir) / "pg")  # run as root, PostgreSQL is another user
        server = embedded.EmbeddedServer(Path(tmpdir) / "pg")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            url = await server.start()
        try:
            conn = await database.connect(url)
            await database.migrate(conn)
            await conn.close()
            if procrastinate is not None:
                schema = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=1)
                await schema.open_async()
                await procrastinate.App(connector=schema).schema_manager.apply_schema_async()
                await schema.close_async()
            for _ in range(max(args.rounds, 1)):
                for workers in WORKERS:
                    for name, system in systems.items():
                        samples[name][workers].append(
                            await measure(system, url, workers, args.jobs)
                        )
        finally:
            await server.stop()

    rate: dict[str, dict[int, float | None]] = {
        name: {w: (statistics.median(samples[name][w]) if name in systems else None)
               for w in WORKERS}
        for name in ("comfyveil", "procrastinate", "naive")
    }
    theirs_label = (
        f"procrastinate {procrastinate_version}" if procrastinate_version else "procrastinate"
    )
    print(f"jobs/s, claim + complete, {args.jobs} jobs, median of {args.rounds} rounds")
    print(f"{'workers':>7}  {'comfyveil':>10}  {theirs_label:>20}  {'naive FOR UPDATE':>16}"
          f"  {'vs procr.':>9}  {'vs naive':>8}")
    for w in WORKERS:
        ours_rate, theirs_rate, naive_rate = (rate[n][w] for n in rate)
        theirs_cell = f"{theirs_rate:20.1f}" if theirs_rate is not None else f"{'skipped':>20}"
        vs_theirs = _ratio(ours_rate, theirs_rate)
        print(f"{w:>7}  {ours_rate:10.1f}  {theirs_cell}  {naive_rate:16.1f}"
              f"  {(f'{vs_theirs:.2f}' if vs_theirs is not None else '-'):>9}"
              f"  {_ratio(ours_rate, naive_rate):8.2f}")
    if procrastinate is None:
        print("procrastinate baseline skipped: not installed (pip install .[bench])")

    def figures(name: str) -> dict[str, float] | None:
        if name not in systems:
            return None
        return {str(w): round(v, 1) for w, v in rate[name].items() if v is not None}

    summary = {
        "benchmark": "queue_throughput", "jobs": args.jobs, "rounds": args.rounds,
        "comfyveil_jobs_per_s": figures("comfyveil"),
        "procrastinate_jobs_per_s": figures("procrastinate"),
        "procrastinate_version": procrastinate_version,
        "naive_jobs_per_s": figures("naive"),
        "ratio_vs_procrastinate": {str(w): _ratio(rate["comfyveil"][w], rate["procrastinate"][w])
                                   for w in WORKERS} if procrastinate_version else None,
        "ratio_vs_naive": {str(w): _ratio(rate["comfyveil"][w], rate["naive"][w])
                           for w in WORKERS},
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    asyncio.run(main())
