"""End-to-end overhead: the whole chat path against a direct ComfyUI call.

    .venv/bin/python benchmarks/e2e_overhead.py [--levels 1,10,100] [--jobs 40]

Path measured ("ours"): a user's message on a fake Telegram Bot API server -> the bot
(python-telegram-bot long polling) -> PostgreSQL (embedded) -> the worker -> a fake
ComfyUI whose nodes take no time -> the photo sent back to the fake Telegram. Latency is
from the moment the update is queued on the fake server to the moment the photo arrives.

Baseline ("direct"): `comfy.execute.execute` (upload, submit, follow, download) on the
same fake ComfyUI with the same workflow and values, the same number of concurrent users.

Each user sends its next command when its previous result arrived (closed loop). Added
latency = ours - direct, at p50 and p99. "ours" runs with python-telegram-bot's
AIORateLimiter at Telegram's limits (30 messages/s), as in production; the "no limiter"
row shows what the code itself adds. RSS is this process's (bot + worker + both fakes),
an upper bound for the bot. Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("PTB_TIMEDELTA", "true")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram

from comfyveil import config
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import execute, pool, workflow
from comfyveil.store import database, embedded
from comfyveil.telegram import app
from comfyveil.worker import Worker, WorkerOptions

COMMAND = "/f a red fox in snow --width 256 --height 256 --steps 1"
VALUES = {"prompt": "a red fox in snow", "width": 256, "height": 256, "steps": 1}
TARGET_P50_MS = 25.0  # at 10 users
TARGET_P99_MS = 100.0
TARGET_RSS_MB = 200.0


class BenchTelegram(FakeTelegram):
    """The fake Bot API, telling the benchmark directly when a chat receives its photo.

    `FakeTelegram.wait_for_call` re-scans every recorded call on every call, for every
    waiter: at 100 users that bookkeeping would cost more than the bot itself, and it is
    the harness's cost, not the code under test's.
    """

    def __init__(self) -> None:
        super().__init__()
        self.photo_waiters: dict[int, asyncio.Future[float]] = {}

    def expect_photo(self, chat_id: int) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.photo_waiters[chat_id] = future
        return future

    def _api_sendphoto(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        at = time.monotonic()  # when the request arrived, before the fake re-encodes it
        result = super()._api_sendphoto(params, files)
        future = self.photo_waiters.pop(int(params["chat_id"]), None)
        if future is not None and not future.done():
            future.set_result(at)
        return result


class NoLimiter:
    """A rate limiter that limits nothing (to see the code's own overhead)."""

    async def initialize(self) -> None: ...
    async def shutdown(self) -> None: ...

    async def process_request(self, callback: Any, args: Any, kwargs: Any, endpoint: str,
                              data: dict[str, Any], rate_limit_args: Any) -> Any:
        return await callback(*args, **kwargs)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def direct(comfy: FakeComfyUI, users: int, per_user: int) -> tuple[list[float], float]:
    wf = workflow.find("f")
    latencies: list[float] = []
    async with comfy_client.ComfyClient(comfy.url, name="gpu0") as client:
        await execute.execute(client, wf, wf.validate(VALUES))  # warm-up

        async def user() -> None:
            for _ in range(per_user):
                started = time.perf_counter()
                await execute.execute(client, wf, wf.validate(VALUES))
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(users)))
        wall = time.perf_counter() - started
    return latencies, wall


async def ours(
    telegram: BenchTelegram, comfy: FakeComfyUI, db: database.Database, users: int,
    per_user: int, first_user: int, *, limiter: bool,
) -> tuple[list[float], float]:
    settings = config.Settings(
        telegram=config.TelegramConfig(token=telegram.token, api_url=telegram.url, open=True,
                                       poll_timeout=1.0),
        backends=(config.BackendConfig(name="gpu0", url=comfy.url, via="direct"),),
        limits=config.LimitsConfig(daily_quota=100_000, max_queued=100),
    )
    latencies: list[float] = []
    async with pool.Pool(settings.backend_list(), probe_interval=1.0) as backends:
        bot = app.TelegramBot(settings, db, pool=backends,
                              rate_limiter=None if limiter else NoLimiter())  # type: ignore[arg-type]
        worker = Worker(db, backends, sinks=[bot.sink], options=WorkerOptions(
            poll_interval=1.0, lease_seconds=60.0))
        await bot.start()
        task = asyncio.create_task(worker.run())
        try:
            async def one(chat: int, count: int) -> float:
                photo = telegram.expect_photo(chat)
                telegram.user_sends(chat, COMMAND)
                sent = time.monotonic()
                return await asyncio.wait_for(photo, 300) - sent

            await one(first_user - 1, 1)  # warm-up

            async def user(chat: int) -> None:
                for n in range(1, per_user + 1):
                    latencies.append(await one(chat, n))

            started = time.perf_counter()
            await asyncio.gather(*(user(first_user + i) for i in range(users)))
            wall = time.perf_counter() - started
        finally:
            await bot.stop_updates()
            worker.stop()
            await task
            await bot.close()
    return latencies, wall


async def main(levels: list[int], jobs_per_level: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="comfyveil-bench-e2e-"))
    server = embedded.EmbeddedServer(root / "pg")
    url = await server.start()
    comfy = FakeComfyUI(root=root / "comfy")
    await comfy.start()
    telegram = BenchTelegram()
    await telegram.start()
    db = await database.Database.open(url=url, max_size=20)
    await db.commands.seed()
    rows: list[dict[str, Any]] = []
    next_user = 10_000
    try:
        for users in levels:
            per_user = max(1, jobs_per_level // users)
            base, base_wall = await direct(comfy, users, per_user)
            for limiter in (True, False):
                mine, wall = await ours(telegram, comfy, db, users, per_user, next_user + 1,
                                        limiter=limiter)
                next_user += users + 10
                rows.append({
                    "users": users, "rate_limiter": limiter, "jobs": len(mine),
                    "direct_p50_ms": pct(base, 0.5) * 1000, "direct_p99_ms": pct(base, 0.99) * 1000,
                    "ours_p50_ms": pct(mine, 0.5) * 1000, "ours_p99_ms": pct(mine, 0.99) * 1000,
                    "added_p50_ms": (pct(mine, 0.5) - pct(base, 0.5)) * 1000,
                    "added_p99_ms": (pct(mine, 0.99) - pct(base, 0.99)) * 1000,
                    "direct_jobs_per_s": len(base) / base_wall,
                    "ours_jobs_per_s": len(mine) / wall,
                    "mean_ms": statistics.fmean(mine) * 1000,
                })
        rss_mb = psutil.Process().memory_info().rss / (1024 * 1024)
    finally:
        await db.close()
        await telegram.close()
        await comfy.stop()
        await server.stop()
    at10 = [r for r in rows if r["users"] == 10 and r["rate_limiter"]]
    return {
        "benchmark": "e2e_overhead", "rows": rows, "rss_mb": rss_mb,
        "targets": {"added_p50_ms_at_10": TARGET_P50_MS, "added_p99_ms_at_10": TARGET_P99_MS,
                    "rss_mb": TARGET_RSS_MB},
        "met": {
            "added_p50_at_10": bool(at10) and at10[0]["added_p50_ms"] <= TARGET_P50_MS,
            "added_p99_at_10": bool(at10) and at10[0]["added_p99_ms"] <= TARGET_P99_MS,
            "rss": rss_mb <= TARGET_RSS_MB,
        },
    }


def print_table(result: dict[str, Any]) -> None:
    head = (f"{'users':>5} {'limiter':>7} {'jobs':>5} {'direct p50':>10} {'ours p50':>9} "
            f"{'added p50':>9} {'added p99':>9} {'direct j/s':>10} {'ours j/s':>8}")
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        print(f"{r['users']:>5} {'on' if r['rate_limiter'] else 'off':>7} {r['jobs']:>5} "
              f"{r['direct_p50_ms']:>8.1f}ms {r['ours_p50_ms']:>7.1f}ms "
              f"{r['added_p50_ms']:>+7.1f}ms {r['added_p99_ms']:>+7.1f}ms "
              f"{r['direct_jobs_per_s']:>10.1f} {r['ours_jobs_per_s']:>8.1f}")
    print(f"RSS of the benchmark process (bot, worker and both fakes): {result['rss_mb']:.0f} MB")
    print(f"targets at 10 users: added p50 <= {TARGET_P50_MS:.0f} ms, p99 <= "
          f"{TARGET_P99_MS:.0f} ms; RSS <= {TARGET_RSS_MB:.0f} MB; met: {result['met']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,10,100")
    parser.add_argument("--jobs", type=int, default=40, help="jobs per level (about)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ResourceWarning)
    outcome = asyncio.run(main([int(x) for x in args.levels.split(",")], args.jobs))
    print_table(outcome)
    print(json.dumps(outcome))
