"""End-to-end overhead: the whole chat path against a direct ComfyUI call.

    .venv/bin/python benchmarks/e2e_overhead.py [--levels 1,10,100] [--jobs 40] [--pause 0]
                                                [--spread SECONDS]

Path measured ("ours"): the real product, `python -m comfyveil run --config FILE`, in its
own process (bot, worker and database pool, as deployed), with python-telegram-bot
pointed at a fake Telegram Bot API server (`[telegram] api_url`), PostgreSQL embedded
(pgserver, started by this benchmark) and one backend: a fake ComfyUI whose nodes take
no time. A user's message is queued on the fake Telegram; latency runs from then to the
moment the bot's sendPhoto request for that chat reaches the fake.

This process runs only the two fakes, the simulated users and the baseline, so the
fakes' CPU work (JSON, PNG writing, photo re-encoding) competes with the product only
for the machine's cores, not for its event loop. The RSS figure is the product
process's own (psutil, sampled during the largest level; its peak).

Baseline ("direct"): `comfy.execute.execute` (upload, submit, follow, download) from this
process on the same fake ComfyUI with the same workflow and values, with the same number
of concurrent users, in the same run.

Each user sends its next command when its previous result arrived (closed loop), after
`--pause` seconds; the users' first commands are spread evenly over `--spread` seconds
(default: the pause, as users who arrive one by one; with no pause, all at once). Added
latency = ours - direct, at p50 and p99; both paths see the same arrivals. Apart from
those timed rounds, each level also sends BURST_ROUNDS bursts in which every user sends
one command at the same instant, and reports the slowest answer through the bot minus
the slowest direct one ("burst worst", the median over the bursts).

The product keeps its production rate limiter: comfyveil's ChatRateLimiter
(telegram/limits.py: 29 messages/s overall, one a second to a private chat after a
burst of 3, 19/min per group chat, results before status edits) and 3 retries on
RetryAfter; a user who gets results faster than one a second waits for Telegram's
per-chat limit after the burst. A job whose result comes within `status_delay` (1 s;
all of them here, the nodes take no time) costs one Bot API call, the photo, so a closed
loop meets the limiter at about 30 jobs/s, where Telegram itself would stop a real bot;
rows where it did are marked, and `--pause S` (each user waits S seconds between jobs)
measures latency below it. Also reported per
level: the bot's CPU per job and the CPU shares of the bot and of this process. Prints
a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import os
import shutil
import signal
import statistics
import subprocess
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
from tests.fixtures.database import open_for_the_database_user

from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import execute, workflow
from comfyveil.store import embedded

COMMAND = "/f a red fox in snow --width 256 --height 256 --steps 1"
VALUES = {"prompt": "a red fox in snow", "width": 256, "height": 256, "steps": 1}
TARGET_P50_MS = 25.0  # at 10 users
TARGET_P99_MS = 100.0
TARGET_RSS_MB = 200.0
RATE_LIMITER = ("ChatRateLimiter defaults (29 msg/s overall, 1/s per private chat after "
                "a burst of 3, 19/min per group chat), max_retries=3, as in production")
LIMITER_RATE = 29.0  # messages/s the limiter allows overall
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
RSS_SAMPLE_INTERVAL = 0.05
BURST_ROUNDS = 5
BURST_SETTLE = 0.5  # seconds between two bursts, so each starts on an idle bot


# Each request to the fake is handled in its own task, so this is per request.
REQUEST_ARRIVED: contextvars.ContextVar[float] = contextvars.ContextVar("request_arrived")


class BenchTelegram(FakeTelegram):
    """The fake Bot API, telling the benchmark directly when a chat receives its photo.

    `FakeTelegram.wait_for_call` re-scans every recorded call on every call, for every
    waiter: at 100 users that bookkeeping would cost more than the bot itself, and it is
    the harness's cost, not the code under test's.
    """

    def __init__(self) -> None:
        super().__init__()
        self.photo_waiters: dict[int, asyncio.Future[float]] = {}
        self.polled = asyncio.Event()  # the bot's first getUpdates arrived

    async def _api_getupdates(self, params: dict[str, Any], files: Any) -> list[dict[str, Any]]:
        self.polled.set()  # getUpdates is answered before FakeTelegram records calls
        return await super()._api_getupdates(params, files)

    def expect_photo(self, chat_id: int) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.photo_waiters[chat_id] = future
        return future

    async def _handle_method(self, request: Any) -> Any:
        # Stamped before the fake reads the multipart body: its parsing is harness work.
        REQUEST_ARRIVED.set(time.monotonic())
        return await super()._handle_method(request)

    def _api_sendphoto(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        at = REQUEST_ARRIVED.get()  # when the request arrived, not when it was parsed
        result = super()._api_sendphoto(params, files)
        future = self.photo_waiters.pop(int(params["chat_id"]), None)
        if future is not None and not future.done():
            future.set_result(at)
        return result


def harness_cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def write_config(path: Path, *, root: Path, telegram: FakeTelegram, comfy: FakeComfyUI,
                 db_url: str) -> None:
    path.write_text(
        f"data_dir = {json.dumps(str(root / 'data'))}\n\n"
        "[database]\n"
        f"url = {json.dumps(db_url)}\n\n"
        "[telegram]\n"
        f"api_url = {json.dumps(telegram.url)}\n"
        "open = true\n\n"
        "[[backends]]\n"
        'name = "gpu0"\n'
        f"url = {json.dumps(comfy.url)}\n"
        'via = "direct"\n\n'
        "[limits]\n"
        "daily_quota = 1000000\n"
        "max_queued = 1000\n"
        "cooldown = 0.0\n\n"
        "[anyone]\n"
        "enabled = false\n\n"
        "[web]\n"
        "enabled = false\n",  # the bot alone is measured
        encoding="utf-8",
    )


class Product:
    """`python -m comfyveil run` as a child process; stopped with SIGTERM."""

    def __init__(self, config_file: Path, token: str, log_file: Path) -> None:
        self.config_file = config_file
        self.token = token
        self.log_file = log_file
        self.proc: asyncio.subprocess.Process | None = None
        self.ps: psutil.Process | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in {"DATABASE_URL", "COMFYVEIL_CONFIG", "COMFYVEIL_TELEGRAM_TOKEN"}}
        env["COMFYVEIL_TELEGRAM_TOKEN"] = self.token
        with self.log_file.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "comfyveil", "run", "--config", str(self.config_file),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        self.ps = psutil.Process(self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def rss_mb(self) -> float:
        assert self.ps is not None
        with contextlib.suppress(psutil.Error):
            return self.ps.memory_info().rss / (1024 * 1024)
        return float("nan")

    def cpu_s(self) -> float:
        """User + system CPU seconds the bot process has used so far."""
        assert self.ps is not None
        with contextlib.suppress(psutil.Error):
            times = self.ps.cpu_times()
            return times.user + times.system
        return float("nan")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self) -> int | None:
        """SIGTERM, wait for a clean exit; kill only if it does not come."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return self.proc.returncode


async def wait_ready(product: Product, telegram: BenchTelegram) -> float:
    """Until the bot published its menu and long-polls; return seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < READY_TIMEOUT:
        if not product.alive():
            raise RuntimeError("the bot process exited while starting:\n" + product.log_tail())
        if telegram.calls("setMyCommands") and telegram.polled.is_set():
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise RuntimeError("the bot process was not ready in time:\n" + product.log_tail())


def start_offset(user: int, users: int, spread: float) -> float:
    """When user number `user` sends its first message: evenly over `spread` seconds."""
    return spread * user / users


async def direct(comfy: FakeComfyUI, users: int, per_user: int, pause: float,
                 spread: float) -> tuple[list[float], float]:
    wf = workflow.find("f")
    latencies: list[float] = []
    async with comfy_client.ComfyClient(comfy.url, name="gpu0") as client:
        await execute.execute(client, wf, wf.validate(VALUES))  # warm-up

        async def user(number: int) -> None:
            await asyncio.sleep(start_offset(number, users, spread))
            for n in range(per_user):
                if n and pause:
                    await asyncio.sleep(pause)
                started = time.perf_counter()
                await execute.execute(client, wf, wf.validate(VALUES))
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(user(i) for i in range(users)))
        wall = time.perf_counter() - started
    return latencies, wall


async def one(telegram: BenchTelegram, product: Product, chat: int) -> float:
    photo = telegram.expect_photo(chat)
    telegram.user_sends(chat, COMMAND)
    sent = time.monotonic()
    deadline = sent + 300
    while not photo.done():
        if not product.alive():
            raise RuntimeError("the bot process died:\n" + product.log_tail())
        if time.monotonic() > deadline:
            raise RuntimeError(f"no photo for chat {chat} within 300 s")
        await asyncio.wait({photo}, timeout=1.0)
    return photo.result() - sent


async def ours(telegram: BenchTelegram, product: Product, users: int, per_user: int,
               first_user: int, *, pause: float, spread: float,
               sample_rss: bool) -> tuple[list[float], float, float]:
    latencies: list[float] = []
    await one(telegram, product, first_user - 1)  # warm-up
    peak = product.rss_mb()
    sampling = True

    async def sampler() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, product.rss_mb())
            await asyncio.sleep(RSS_SAMPLE_INTERVAL)

    async def user(number: int) -> None:
        await asyncio.sleep(start_offset(number, users, spread))
        for n in range(per_user):
            if n and pause:
                await asyncio.sleep(pause)
            latencies.append(await one(telegram, product, first_user + number))

    sampling_task = asyncio.create_task(sampler()) if sample_rss else None
    try:
        started = time.perf_counter()
        await asyncio.gather(*(user(i) for i in range(users)))
        wall = time.perf_counter() - started
    finally:
        sampling = False
        if sampling_task is not None:
            await sampling_task
    return latencies, wall, max(peak, product.rss_mb())


async def bursts(comfy: FakeComfyUI, telegram: BenchTelegram, product: Product, users: int,
                 first_user: int) -> list[float]:
    """Each round, every user sends one message at the same instant, first straight to
    the fake ComfyUI, then through the bot; the round's slowest answer through the bot
    minus the slowest direct one, for each of BURST_ROUNDS rounds."""
    added = []
    for n in range(BURST_ROUNDS):
        base, _ = await direct(comfy, users, 1, 0.0, 0.0)
        mine, _, _ = await ours(telegram, product, users, 1, first_user + n * (users + 10),
                                pause=0.0, spread=0.0, sample_rss=False)
        added.append(max(mine) - max(base))
        await asyncio.sleep(BURST_SETTLE)
    return added


async def main(levels: list[int], jobs_per_level: int, pause: float = 0.0,
               spread: float | None = None) -> dict[str, Any]:
    spread = pause if spread is None else spread
    root = Path(tempfile.mkdtemp(prefix="comfyveil-bench-e2e-"))
    open_for_the_database_user(root / "pg")  # run as root, PostgreSQL is another user
    server = embedded.EmbeddedServer(root / "pg")
    db_url = await server.start()
    comfy = FakeComfyUI(root=root / "comfy")
    await comfy.start()
    telegram = BenchTelegram()
    await telegram.start()
    config_file = root / "comfyveil.toml"
    write_config(config_file, root=root, telegram=telegram, comfy=comfy, db_url=db_url)
    product = Product(config_file, telegram.token, root / "bot.log")
    rows: list[dict[str, Any]] = []
    next_user = 10_000
    rss_peak_mb = float("nan")
    exit_code: int | None = None
    try:
        await product.start()
        print(f"bot process pid {product.proc.pid if product.proc else '?'}", file=sys.stderr,
              flush=True)
        ready_s = await wait_ready(product, telegram)
        rss_idle_mb = product.rss_mb()
        largest = max(levels)
        for users in levels:
            per_user = max(1, jobs_per_level // users)
            base, base_wall = await direct(comfy, users, per_user, pause, spread)
            calls_before = len(telegram.sent)
            cpu_before = product.cpu_s()
            harness_before = harness_cpu_s()
            mine, wall, peak = await ours(telegram, product, users, per_user, next_user + 1,
                                          pause=pause, spread=spread,
                                          sample_rss=users == largest)
            if users == largest:
                rss_peak_mb = peak
            next_user += users + 10
            calls = len(telegram.sent) - calls_before  # Bot API calls but getUpdates
            cpu = product.cpu_s() - cpu_before
            harness = harness_cpu_s() - harness_before
            burst_added = await bursts(comfy, telegram, product, users, next_user + 1)
            next_user += BURST_ROUNDS * (users + 10)
            rows.append({
                "users": users, "jobs": len(mine),
                "direct_p50_ms": pct(base, 0.5) * 1000, "direct_p99_ms": pct(base, 0.99) * 1000,
                "ours_p50_ms": pct(mine, 0.5) * 1000, "ours_p99_ms": pct(mine, 0.99) * 1000,
                "added_p50_ms": (pct(mine, 0.5) - pct(base, 0.5)) * 1000,
                "added_p99_ms": (pct(mine, 0.99) - pct(base, 0.99)) * 1000,
                "direct_jobs_per_s": len(base) / base_wall,
                "ours_jobs_per_s": len(mine) / wall,
                "mean_ms": statistics.fmean(mine) * 1000,
                "bot_api_calls_per_job": calls / (len(mine) + 1),  # + the warm-up job
                "bot_cpu_ms_per_job": cpu / (len(mine) + 1) * 1000,
                "bot_cpu_share": cpu / wall,  # of one core, over the timed part
                "harness_cpu_share": harness / wall,  # this process: fakes and users
                "bot_api_req_per_s": calls / wall,
                "limiter_bound": calls / wall >= 0.9 * LIMITER_RATE,
                "burst_added_worst_ms": statistics.median(burst_added) * 1000,
                "burst_added_worst_ms_each": [round(a * 1000, 1) for a in burst_added],
            })
    finally:
        exit_code = await product.stop()
        await telegram.close()
        await comfy.stop()
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)
    at10 = [r for r in rows if r["users"] == 10]
    return {
        "benchmark": "e2e_overhead", "setup": "product in its own process (comfyveil run)",
        "rate_limiter": RATE_LIMITER, "rows": rows,
        "bot_ready_s": ready_s, "rss_idle_mb": rss_idle_mb,
        "rss_peak_mb": rss_peak_mb, "rss_peak_at_users": max(levels),
        "bot_exit_code": exit_code, "cpus": os.cpu_count(), "pause_s": pause,
        "start_spread_s": spread, "burst_rounds": BURST_ROUNDS,
        "targets": {"added_p50_ms_at_10": TARGET_P50_MS, "added_p99_ms_at_10": TARGET_P99_MS,
                    "rss_mb_at_100": TARGET_RSS_MB},
        "met": {
            "added_p50_at_10": bool(at10) and at10[0]["added_p50_ms"] <= TARGET_P50_MS,
            "added_p99_at_10": bool(at10) and at10[0]["added_p99_ms"] <= TARGET_P99_MS,
            "rss": rss_peak_mb <= TARGET_RSS_MB,
        },
    }


def print_table(result: dict[str, Any]) -> None:
    head = (f"{'users':>5} {'jobs':>5} {'direct p50':>10} {'ours p50':>9} {'added p50':>9} "
            f"{'added p99':>9} {'direct j/s':>10} {'ours j/s':>8} {'API req/s':>9} "
            f"{'calls/job':>9} {'bot CPU/job':>11} {'bot CPU':>7} {'fakes CPU':>9} "
            f"{'burst worst':>11}")
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        print(f"{r['users']:>5} {r['jobs']:>5} "
              f"{r['direct_p50_ms']:>8.1f}ms {r['ours_p50_ms']:>7.1f}ms "
              f"{r['added_p50_ms']:>+7.1f}ms {r['added_p99_ms']:>+7.1f}ms "
              f"{r['direct_jobs_per_s']:>10.1f} {r['ours_jobs_per_s']:>8.1f} "
              f"{r['bot_api_req_per_s']:>8.1f}{'*' if r['limiter_bound'] else ' '} "
              f"{r['bot_api_calls_per_job']:>9.1f} {r['bot_cpu_ms_per_job']:>9.1f}ms "
              f"{r['bot_cpu_share']:>6.0%} {r['harness_cpu_share']:>9.0%} "
              f"{r['burst_added_worst_ms']:>+9.1f}ms")
    print(f"product: `comfyveil run` in its own process (ready in {result['bot_ready_s']:.1f} s, "
          f"exit code {result['bot_exit_code']} after SIGTERM); {result['cpus']} CPUs shared "
          "with the fakes")
    print(f"rate limiter: {result['rate_limiter']}; * = Bot API traffic at >= 90% of "
          f"{LIMITER_RATE:.0f} req/s: the limiter caps jobs/s near {LIMITER_RATE:.0f} / calls "
          "per job and queues the rest (use --pause to stay under it)")
    print(f"each user waits {result['pause_s']:g} s after a result before its next message; "
          f"their first messages are spread evenly over {result['start_spread_s']:g} s; "
          "CPU shares are of one core over the timed part")
    print(f"burst worst: all users send one message at the same instant; the slowest answer "
          f"through the bot minus the slowest direct one (median of {result['burst_rounds']} "
          "such rounds, not timed above)")
    print(f"RSS of the bot process: {result['rss_idle_mb']:.0f} MB idle, peak "
          f"{result['rss_peak_mb']:.0f} MB during the {result['rss_peak_at_users']}-user level")
    print(f"targets at 10 users: added p50 <= {TARGET_P50_MS:.0f} ms, p99 <= "
          f"{TARGET_P99_MS:.0f} ms; RSS <= {TARGET_RSS_MB:.0f} MB; met: {result['met']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,10,100")
    parser.add_argument("--jobs", type=int, default=40, help="jobs per level (about)")
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds each user waits after a result before its next message "
                        "(keeps the load under Telegram's rate limit)")
    parser.add_argument("--spread", type=float, default=None,
                        help="seconds over which the users' first messages are spread "
                        "evenly (default: the pause, as users who arrive one by one; 0: "
                        "all at the same instant)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ResourceWarning)
    outcome = asyncio.run(main([int(x) for x in args.levels.split(",")], args.jobs, args.pause,
                               args.spread))
    print_table(outcome)
    print(json.dumps(outcome))
