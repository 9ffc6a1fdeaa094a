"""Queue throughput: claim + complete jobs per second with 1 and 4 workers.

    .venv/bin/python benchmarks/queue_throughput.py [--jobs 400]

comfyveil's claim (`FOR UPDATE SKIP LOCKED`, round-robin between users, a lease and an
event row) and complete are measured against a naive baseline on the same database: a
`SELECT ... FOR UPDATE` without SKIP LOCKED, where concurrent workers queue up behind the
same row lock. (procrastinate and pgqueuer are not installed here, so the baseline is
this textbook loop.) No GPU is involved: this is the database's side of the queue alone.
Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from comfyveil.store import database, embedded, jobs

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


async def fill(db: database.Database, count: int) -> None:
    for i in range(count):
        await db.jobs.enqueue(jobs.NewJob(user_id=1 + i % 8, chat_id=1, command="f",
                                          workflow_hash="bench", params={"i": i}))


async def ours(db: database.Database, workers: int) -> int:
    async def loop(name: str) -> int:
        done = 0
        while (job := await db.jobs.claim(name)) is not None:
            await db.jobs.complete(job, [])
            done += 1
        return done

    return sum(await asyncio.gather(*(loop(f"w{i}") for i in range(workers))))


async def naive(db: database.Database, workers: int) -> int:
    async def loop(name: str) -> int:
        done = 0
        while True:
            async with db.pool.connection() as conn:
                row = await (await conn.execute(NAIVE_CLAIM, {"worker": name})).fetchone()
                if row is None:
                    return done
                await conn.execute(NAIVE_COMPLETE, {"id": row["id"], "worker": name})
            done += 1

    return sum(await asyncio.gather(*(loop(f"n{i}") for i in range(workers))))


async def measure(url: str, runner: Any, workers: int, count: int) -> float:
    db = await database.Database.open(url=url, run_migrations=False, max_size=workers + 2)
    try:
        async with db.pool.connection() as conn:
            await conn.execute("TRUNCATE jobs, queue_turns CASCADE")
        await fill(db, count)
        started = time.perf_counter()
        done = await runner(db, workers)
        elapsed = time.perf_counter() - started
        assert done == count, f"{done} of {count} jobs processed"
    finally:
        await db.close()
    return count / elapsed


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    args = parser.parse_args(argv)
    results: dict[str, dict[str, float]] = {"comfyveil": {}, "baseline": {}}
    with tempfile.TemporaryDirectory(prefix="comfyveil-bench-") as tmpdir:
        server = embedded.EmbeddedServer(Path(tmpdir) / "pg")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            url = await server.start()
        try:
            conn = await database.connect(url)
            await database.migrate(conn)
            await conn.close()
            for workers in (1, 4):
                results["comfyveil"][str(workers)] = await measure(url, ours, workers, args.jobs)
                results["baseline"][str(workers)] = await measure(url, naive, workers, args.jobs)
        finally:
            await server.stop()
    print(f"{'workers':>7}  {'comfyveil jobs/s':>17}  {'naive FOR UPDATE jobs/s':>24}  ratio")
    for workers in ("1", "4"):
        a, b = results["comfyveil"][workers], results["baseline"][workers]
        print(f"{workers:>7}  {a:17.1f}  {b:24.1f}  {a / b:5.2f}")
    summary = {
        "benchmark": "queue_throughput", "jobs": args.jobs,
        "comfyveil_jobs_per_s": {k: round(v, 1) for k, v in results["comfyveil"].items()},
        "baseline_jobs_per_s": {k: round(v, 1) for k, v in results["baseline"].items()},
        "baseline": "SELECT ... FOR UPDATE without SKIP LOCKED",
        "ratio_4_workers": round(results["comfyveil"]["4"] / results["baseline"]["4"], 2),
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    asyncio.run(main())
