"""The hot read queries with 200 000 finished jobs kept, against the same on an empty table.

    .venv/bin/python benchmarks/queries_at_scale.py [--history 200000] [--runs 300]

Finished jobs stay until the retention purge (7 days by default), so a busy bot keeps
hundreds of thousands. The queries that run all the time must not read them:

- `position_and_eta`: a queued job's place and ETA, for every tracked job on every change
  of the queue (it reads the last 20 runs of each command ahead for the ETA);
- `command_durations`: the mean of the last 20 runs per command (a running job's ETA);
- `undelivered_jobs`: each sink's catch-up loop, looking for results nobody delivered.

Setup: an embedded PostgreSQL with the current schema and two databases, `empty` and
`full`. Both hold the same 30 queued jobs (10 users, 3 each); `full` also holds
`--history` finished jobs (5 commands, 4 backends, 95 % succeeded), every one delivered
to the `telegram` sink, inserted in one `generate_series` statement each, then ANALYZEd.
Each query runs `--runs` times through comfyveil's own store methods, alternating between
the two databases so they share the machine's conditions; the figure is the ratio of the
medians (full / empty): 1.0 means the history costs nothing. The plan of each query on
`full` is checked for a sequential scan of `jobs` or `deliveries`.
Prints a table, then one JSON object as the very last line.
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from tests.fixtures import plans
from tests.fixtures.database import open_for_the_database_user

from comfyveil.store import database, embedded, jobs

USERS = 10
QUEUED_PER_USER = 3
COMMANDS = ("f", "fd", "sd3", "qwen", "wan")
WARM_UP = 20  # runs per query and database not counted (plans, caches)
TARGET_RATIO = 2.0

HISTORY = """
INSERT INTO jobs (id, user_id, chat_id, command, workflow_hash, params, status, submitted,
                  backend, attempts, created_at, started_at, finished_at, updated_at)
SELECT gen_random_uuid(), 1000 + g %% 500, 1000 + g %% 500,
       (ARRAY['f', 'fd', 'sd3', 'qwen', 'wan'])[1 + g %% 5], 'old',
       '{"prompt": "a red fox"}'::jsonb,
       (CASE WHEN g %% 20 = 0 THEN 'failed' WHEN g %% 20 = 1 THEN 'cancelled'
             ELSE 'succeeded' END)::job_status,
       true, 'gpu' || (g %% 4), 1,
       now() - make_interval(secs => g * 2 + 30), now() - make_interval(secs => g * 2 + 20),
       now() - make_interval(secs => g * 2), now() - make_interval(secs => g * 2)
FROM generate_series(1, %(count)s) AS g
"""
DELIVERED = """
INSERT INTO deliveries (job_id, sink, delivered_at)
SELECT id, 'telegram', finished_at FROM jobs WHERE finished_at IS NOT NULL
"""
EXPLAIN_PARAMS: dict[str, dict[str, Any]] = {
    "position_and_eta": {},  # job_id filled in
    "command_durations": {"commands": list(COMMANDS), "backend": None},
    "undelivered_jobs": {"sink": "telegram", "limit": 100},
}


async def _fill(db: database.Database, history: int) -> list[jobs.Job]:
    """The queued jobs every scenario has, after the history (if any); the last one queued
    is the job whose place is asked (the most jobs ahead of it)."""
    async with db.pool.connection() as conn:
        if history:
            await conn.execute(HISTORY, {"count": history})
            await conn.execute(DELIVERED)
    queued = []
    for n in range(QUEUED_PER_USER):
        for user in range(1, USERS + 1):
            new = jobs.NewJob(
                user_id=user,
                chat_id=user,
                command=COMMANDS[(user + n) % 5],
                workflow_hash="h",
                params={"prompt": "a fox"},
            )
            queued.append(await db.jobs.enqueue(new))
    async with db.pool.connection() as conn:
        await conn.execute("VACUUM ANALYZE jobs")
        await conn.execute("VACUUM ANALYZE deliveries")
    return queued


async def _plan(url: str, name: str, params: dict[str, Any]) -> str:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await plans.plan(conn, name, params)


def _seq_scans(plan: str) -> list[str]:
    return [
        line.strip()
        for line in plan.splitlines()
        if "Seq Scan on jobs" in line or "Seq Scan on deliveries" in line
    ]


async def main(history: int, runs: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="comfyveil-bench-queries-"))
    open_for_the_database_user(root / "pg")  # run as root, PostgreSQL is another user
    server = embedded.EmbeddedServer(root / "pg")
    try:
        base = await server.start()
        urls = {}
        async with await psycopg.AsyncConnection.connect(base, autocommit=True) as admin:
            for name in ("empty", "full"):
                await admin.execute(f"CREATE DATABASE bench_{name}")
                info = psycopg.conninfo.conninfo_to_dict(base)
                info["dbname"] = f"bench_{name}"
                urls[name] = psycopg.conninfo.make_conninfo(**info)
        dbs = {name: await database.Database.open(url=url) for name, url in urls.items()}
        try:
            started = time.perf_counter()
            targets = {
                "empty": (await _fill(dbs["empty"], 0))[-1],
                "full": (await _fill(dbs["full"], history))[-1],
            }
            fill_s = time.perf_counter() - started
            calls: dict[str, Callable[[str], Awaitable[Any]]] = {
                "position_and_eta": lambda s: dbs[s].jobs.position_and_eta(
                    targets[s].id, parallel=4
                ),
                "command_durations": lambda s: dbs[s].jobs.durations(COMMANDS),
                "undelivered_jobs": lambda s: dbs[s].jobs.undelivered("telegram"),
            }
            # The same answers on both (the ETA inputs aside): the full table is not broken.
            assert (await calls["position_and_eta"]("full"))[0] == (
                await calls["position_and_eta"]("empty")
            )[0]
            assert await calls["undelivered_jobs"]("full") == []
            times: dict[str, dict[str, list[float]]] = {q: {"empty": [], "full": []} for q in calls}
            for n in range(runs + WARM_UP):
                for query, call in calls.items():
                    for scenario in ("empty", "full"):
                        t0 = time.perf_counter()
                        await call(scenario)
                        took = time.perf_counter() - t0
                        if n >= WARM_UP:
                            times[query][scenario].append(took)
            plans = {}
            for query, params in EXPLAIN_PARAMS.items():
                if query == "position_and_eta":
                    params = {"job_id": targets["full"].id}
                plans[query] = _seq_scans(await _plan(urls["full"], query, params))
        finally:
            for db in dbs.values():
                await db.close()
    finally:
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)
    queries = {}
    for query, by in times.items():
        empty_ms = statistics.median(by["empty"]) * 1000
        full_ms = statistics.median(by["full"]) * 1000
        queries[query] = {
            "empty_ms": round(empty_ms, 3),
            "full_ms": round(full_ms, 3),
            "ratio": round(full_ms / empty_ms, 2),
            "seq_scans": plans[query],
        }
    return {
        "benchmark": "queries_at_scale",
        "history_jobs": history,
        "runs": runs,
        "fill_seconds": round(fill_s, 1),
        "queries": queries,
        "target_ratio": TARGET_RATIO,
        "met": all(q["ratio"] < TARGET_RATIO and not q["seq_scans"] for q in queries.values()),
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{result['history_jobs']} finished jobs (inserted in {result['fill_seconds']} s), "
        f"medians of {result['runs']} runs each"
    )
    print(f"{'query':<20} {'empty':>10} {'full':>10} {'ratio':>7}  plan on full")
    print("-" * 72)
    for name, q in result["queries"].items():
        plan = "seq scan: " + "; ".join(q["seq_scans"]) if q["seq_scans"] else "indexes only"
        print(
            f"{name:<20} {q['empty_ms']:>7.3f} ms {q['full_ms']:>7.3f} ms "
            f"{q['ratio']:>6.2f}x  {plan}"
        )
    print(
        f"target: every ratio under {result['target_ratio']:.0f}x, no sequential scan: "
        f"{'met' if result['met'] else 'NOT met'}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--history",
        type=int,
        default=200_000,
        help="finished (and delivered) jobs in the full database",
    )
    parser.add_argument("--runs", type=int, default=300, help="timed runs per query and table")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ResourceWarning)
    outcome = asyncio.run(main(args.history, args.runs))
    print_table(outcome)
    print(json.dumps(outcome))
