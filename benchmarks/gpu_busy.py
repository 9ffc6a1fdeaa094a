"""How busy the pool keeps each GPU: 4 fake backends, 0.5 s jobs, a full queue.

    .venv/bin/python benchmarks/gpu_busy.py [--jobs-per-backend 10] [--seconds 0.5]

Busy fraction of a backend = time it spent executing prompts / time from its first job's
start to its last job's end (taken from the backend's own execution timestamps). Run twice
on the same database and backends: comfyveil's pool (one running + one waiting job per
backend) and a naive baseline (one job per backend at a time, no waiting slot), where
the GPU idles while the worker downloads, saves and claims the next job.
Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.fakes

from tests.fakes.comfyui import FakeComfyUI  # noqa: E402
from tests.fixtures.database import open_for_the_database_user  # noqa: E402

from comfyveil import config  # noqa: E402
from comfyveil.comfy import pool, workflow  # noqa: E402
from comfyveil.store import database, embedded, jobs  # noqa: E402
from comfyveil.worker import Worker, WorkerOptions  # noqa: E402

BACKENDS = 4
TARGET = 0.99


def busy_fraction(fake: FakeComfyUI) -> tuple[float, int]:
    spans = []
    for entry in fake.history_entries.values():
        stamps = {m[0]: m[1].get("timestamp") for m in entry["status"]["messages"]}
        start = stamps.get("execution_start")
        end = stamps.get("execution_success")
        if start is not None and end is not None:
            spans.append((start / 1000, end / 1000))
    if len(spans) < 2:
        return 1.0, len(spans)
    spans.sort()
    busy = sum(end - start for start, end in spans)
    window = max(end for _, end in spans) - spans[0][0]
    return min(1.0, busy / window), len(spans)


async def run_once(
    url: str, per_backend: int, seconds: float, max_waiting: int, tmp: Path, label: str
) -> dict[str, Any]:
    fakes = [FakeComfyUI(delays={"KSampler": seconds}, root=tmp / f"{label}-{i}")
             for i in range(BACKENDS)]
    for fake in fakes:
        await fake.start()
    db = await database.Database.open(url=url, run_migrations=False, max_size=8)
    try:
        await db.commands.seed()
        wf = workflow.find("f")
        for i in range(per_backend * BACKENDS):
            values = wf.validate({"prompt": f"bench {label} {i}", "seed": i, "steps": 1,
                                  "width": 256, "height": 256})
            await db.jobs.enqueue(jobs.NewJob(user_id=1 + i % 3, chat_id=1, command="f",
                                              workflow_hash=wf.hash, params=values))
        # The busy time is read from the fakes' history entries, which no trace deletes.
        configs = [config.BackendConfig(name=f"gpu{i}", url=f.url, via="direct",
                                        max_waiting=max_waiting, no_trace=False)
                   for i, f in enumerate(fakes)]
        options = WorkerOptions(poll_interval=0.5, lease_seconds=30, retry_backoff=0.1)
        async with pool.Pool(configs, probe_interval=1.0) as backends:
            worker = Worker(db, backends, options=options)
            task = asyncio.create_task(worker.run())
            total = per_backend * BACKENDS
            # Polling the fakes' counters: they have no event to wait on.
            while sum(sum(f.executions.values()) for f in fakes) < total or any(  # noqa: ASYNC110
                f.running or f.pending for f in fakes
            ):
                await asyncio.sleep(0.1)
            while worker.running_jobs:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            worker.stop()
            await task
        fractions = [busy_fraction(f) for f in fakes]
    finally:
        await db.close()
        for fake in fakes:
            await fake.stop()
    return {"label": label, "max_waiting": max_waiting,
            "busy": [round(f, 4) for f, _ in fractions], "jobs": [n for _, n in fractions],
            "min_busy": round(min(f for f, _ in fractions), 4)}


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs-per-backend", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="comfyveil-bench-") as tmpdir:
        tmp = Path(tmpdir)
        open_for_the_database_user(tmp / "pg")  # run as root, PostgreSQL is another user
        server = embedded.EmbeddedServer(tmp / "pg")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            url = await server.start()
        try:
            conn = await database.connect(url)
            await database.migrate(conn)
            await conn.close()
            ours = await run_once(url, args.jobs_per_backend, args.seconds, 1, tmp, "comfyveil")
            naive = await run_once(url, args.jobs_per_backend, args.seconds, 0, tmp, "baseline")
        finally:
            await server.stop()
    print(f"{'run':12} {'slots':>5}  " + "  ".join(f"gpu{i:<4}" for i in range(BACKENDS))
          + "   min")
    for row in (ours, naive):
        cells = "  ".join(f"{b * 100:6.2f}%"[:7] for b in row["busy"])
        print(f"{row['label']:12} {1 + row['max_waiting']:>5}  {cells}  "
              f"{row['min_busy'] * 100:6.2f}%")
    result = {
        "benchmark": "gpu_busy", "backends": BACKENDS, "job_seconds": args.seconds,
        "jobs_per_backend": args.jobs_per_backend, "comfyveil": ours, "baseline": naive,
        "target_min_busy": TARGET, "meets_target": ours["min_busy"] >= TARGET,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    asyncio.run(main())
