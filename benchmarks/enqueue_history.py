"""Queueing a command for a user with a long history against one for a new user.

    .venv/bin/python benchmarks/enqueue_history.py [--history 20000] [--jobs 200]

A user's limits (jobs waiting or running, jobs created today) are checked inside the
enqueue statement. Those checks must cost the same whether the user has run ten jobs or
twenty thousand (kept until the retention purge): the statement should read the user's
active and today's jobs, not all of them.

Setup: an embedded PostgreSQL with the current schema; one user with `--history`
finished jobs from two days ago, one user with none. Both queue `--jobs` commands,
interleaved (one each in turn) so they share the machine's conditions; each job is
claimed and completed at once, as a worker would, so neither user's queue grows. The
figure is the ratio of the median enqueue times (long history / new user): 1.0 means the
history costs nothing. Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.database import open_for_the_database_user

from comfyveil.comfy import workflow
from comfyveil.store import database, embedded, jobs

NEW_USER = 1
LONG_HISTORY_USER = 2
WARM_UP = 20  # enqueues per user not counted (plans, caches)

HISTORY = """
INSERT INTO jobs (id, user_id, chat_id, command, workflow_hash, params, status,
                  created_at, started_at, finished_at)
SELECT gen_random_uuid(), %(user)s, %(user)s, 'f', 'old', '{}'::jsonb, 'succeeded',
       now() - interval '2 days' - make_interval(secs => g),
       now() - interval '2 days' - make_interval(secs => g),
       now() - interval '2 days' - make_interval(secs => g)
FROM generate_series(1, %(count)s) AS g
"""


async def main(history: int, count: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="comfyveil-bench-enqueue-"))
    open_for_the_database_user(root / "pg")  # run as root, PostgreSQL is another user
    server = embedded.EmbeddedServer(root / "pg")
    try:
        db = await database.Database.open(url=await server.start())
        try:
            await db.commands.seed()
            async with db.pool.connection() as conn:
                await conn.execute(HISTORY, {"user": LONG_HISTORY_USER, "count": history})
                await conn.execute("ANALYZE jobs")
            wf = workflow.find("f")
            values = wf.validate({"prompt": "a red fox", "width": 256, "height": 256})
            times: dict[int, list[float]] = {NEW_USER: [], LONG_HISTORY_USER: []}
            for n in range(count + WARM_UP):
                for user in (NEW_USER, LONG_HISTORY_USER):
                    new = jobs.NewJob(user_id=user, chat_id=user, command=wf.command,
                                      workflow_hash=wf.hash, params=values)
                    started = time.perf_counter()
                    await db.jobs.enqueue(new, max_active=10, daily_quota=100_000)
                    took = time.perf_counter() - started
                    if n >= WARM_UP:
                        times[user].append(took)
                    claimed = await db.jobs.claim("bench", lease_seconds=60)
                    assert claimed is not None
                    await db.jobs.complete(claimed)
        finally:
            await db.close()
    finally:
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)
    new_ms = statistics.median(times[NEW_USER]) * 1000
    long_ms = statistics.median(times[LONG_HISTORY_USER]) * 1000
    return {
        "benchmark": "enqueue_history", "history_jobs": history, "enqueues_per_user": count,
        "new_user_median_ms": new_ms, "long_history_median_ms": long_ms,
        "ratio_long_to_new": long_ms / new_ms,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'user':<28} {'median enqueue':>14}")
    print("-" * 43)
    print(f"{'new (no jobs)':<28} {result['new_user_median_ms']:>11.2f} ms")
    label = f"{result['history_jobs']} jobs kept"
    print(f"{label:<28} {result['long_history_median_ms']:>11.2f} ms")
    print(f"ratio (long history / new): {result['ratio_long_to_new']:.2f}x over "
          f"{result['enqueues_per_user']} enqueues each, interleaved")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=20_000,
                        help="finished jobs the long-history user already has")
    parser.add_argument("--jobs", type=int, default=200, help="timed enqueues per user")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ResourceWarning)
    outcome = asyncio.run(main(args.history, args.jobs))
    print_table(outcome)
    print(json.dumps(outcome))
