"""What the images API adds: a result through ``POST /v1/images/generations`` against
`comfyveil generate`'s path, on the same fake backend, with the same jobs.

    .venv/bin/python benchmarks/api_overhead.py [--jobs 30]

Path measured ("api"): the real product, `python -m comfyveil run --config FILE` in its
own process (the web front end with the API under /v1, a worker, the database pool, as
deployed), PostgreSQL embedded (pgserver, started here) and one backend, a fake ComfyUI
whose nodes take no time. Latency runs from sending the request with a key to reading
the whole answer (the image as b64_json): key lookup, the desk's checks and policy, the
queue, the worker's claim (NOTIFY), the run, the stored result, the wake-up (NOTIFY) and
the JSON answer.

Baseline ("generate"): `comfy.execute.execute` (upload, submit, follow, download) from
this process on the same fake ComfyUI with the same workflow and values: what
`comfyveil generate` does. One job at a time, the two paths taking turns, in the same
run. Added = api - generate at p50 and p90; target: p50 at most +15 ms. Prints a table,
then one JSON object as the very last line.

Also measured ("jobs"), taking turns with the two above: the same job through the jobs
API, as a client of long work runs it: ``POST /v1/jobs`` (202 at once), the job's event
stream (``GET /v1/jobs/{id}/events``) read to its final state, and the output downloaded
(``GET /v1/jobs/{id}/outputs/0``). Added = jobs - generate; target: p50 at most +15 ms.

And the webhook of each such job: an endpoint of the account on loopback (a receiver in
this process), latency from the job's finished_at in the jobs table to the receiver's
answer (same machine, same clock); target: p50 at most 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from aiohttp import web
from tests.fakes.comfyui import FakeComfyUI
from tests.fixtures.database import open_for_the_database_user

from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import downloads, execute, workflow
from comfyveil.store import api_keys, database, embedded, web_tables, webhooks

PROMPT = "a red fox in snow"
VALUES = {"prompt": PROMPT, "width": 256, "height": 256}
BODY = {"model": "f", "prompt": PROMPT, "size": "256x256", "response_format": "b64_json"}
JOB = {"command": "f", "prompt": PROMPT, "options": {"width": 256, "height": 256}}
TARGET_P50_MS = 15.0
TARGET_WEBHOOK_P50_MS = 100.0
WARMUP = 3
READY_TIMEOUT = 120.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def write_config(path: Path, *, root: Path, comfy: FakeComfyUI, db_url: str) -> None:
    path.write_text(
        f"data_dir = {json.dumps(str(root / 'data'))}\n\n"
        f"[database]\nurl = {json.dumps(db_url)}\n\n"
        f'[[backends]]\nname = "gpu0"\nurl = {json.dumps(comfy.url)}\nvia = "direct"\n\n'
        "[limits]\ndaily_quota = 1000000\nmax_queued = 1000\ncooldown = 0.0\n\n"
        "[anyone]\nenabled = false\n\n"
        "[web]\nenabled = true\nport = 0\n\n"
        # the webhook receiver is this process, on 127.0.0.1
        "[api]\nwebhook_private_targets = true\n",
        encoding="utf-8",
    )


async def start_product(config_file: Path) -> tuple[asyncio.subprocess.Process, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "COMFYVEIL_CONFIG", "COMFYVEIL_TELEGRAM_TOKEN"}
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "comfyveil",
        "run",
        "--config",
        str(config_file),
        stdin=subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    url = ""
    deadline = time.monotonic() + READY_TIMEOUT
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT)).decode()
        if not line or time.monotonic() > deadline:
            raise RuntimeError("the product did not start")
        if "web front end at " in line:
            url = line.split("web front end at ", 1)[1].strip()
        if "runs alone" in line:
            return proc, url


async def drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def make_key(db_url: str, hook_url: str) -> str:
    """A key of a new account, with a webhook endpoint at `hook_url`."""
    async with await database.Database.open(url=db_url, run_migrations=False) as db:
        store = web_tables.WebStore(db.pool)
        token = await store.create_invite(is_admin=False, hours=1)
        account = await store.sign_up(token, "bench", "not-a-real-hash")
        await webhooks.WebhookStore(db.pool).create(account.id, hook_url)
        return await api_keys.ApiKeyStore(db.pool).create(account.id, "bench")


async def start_receiver(
    received: dict[str, float], expected: int, complete: asyncio.Event
) -> tuple[web.AppRunner, str]:
    """A webhook receiver noting when each job's event was answered."""

    async def hook(request: web.Request) -> web.Response:
        event = json.loads(await request.read())
        received[event["data"]["id"]] = time.time()
        if len(received) >= expected:
            complete.set()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/hook"


async def main(jobs: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="comfyveil-bench-api-"))
    open_for_the_database_user(root / "pg")  # run as root, PostgreSQL is another user
    server = embedded.EmbeddedServer(root / "pg")
    db_url = await server.start()
    comfy = FakeComfyUI(root=root / "comfy")
    await comfy.start()
    config_file = root / "comfyveil.toml"
    write_config(config_file, root=root, comfy=comfy, db_url=db_url)
    proc: asyncio.subprocess.Process | None = None
    received: dict[str, float] = {}
    complete = asyncio.Event()
    receiver, hook_url = await start_receiver(received, jobs + WARMUP, complete)
    try:
        proc, url = await start_product(config_file)
        assert proc.stdout is not None
        draining = asyncio.create_task(drain(proc.stdout))
        key = await make_key(db_url, hook_url)
        wf = workflow.find("f")
        out_dir = root / "out"
        out_dir.mkdir()
        headers = {"Authorization": f"Bearer {key}"}
        api_ms: list[float] = []
        stamps: list[float] = []  # wall clock at each API request's start and end, to
        ends: list[float] = []  # set beside the jobs table's times (same machine's clock)
        direct_ms: list[float] = []
        jobs_ms: list[float] = []
        phases: dict[str, list[float]] = {"submit": [], "stream": [], "download": []}
        streamed_at: list[float] = []  # wall clock at each stream's final event
        async with (
            comfy_client.ComfyClient(comfy.url, name="gpu0") as client,
            aiohttp.ClientSession(headers=headers) as http,
        ):

            async def one_api() -> float:
                stamps.append(time.time())
                start = time.perf_counter()
                async with http.post(f"{url}/v1/images/generations", json=BODY) as r:
                    answer = await r.json()
                    if r.status != 200 or len(answer.get("data", [])) != 1:
                        raise RuntimeError(f"the API answered {r.status}: {answer}")
                ends.append(time.time())
                return (time.perf_counter() - start) * 1000

            async def one_job() -> float:
                start = time.perf_counter()
                async with http.post(f"{url}/v1/jobs", json=JOB) as r:
                    job = await r.json()
                    if r.status != 202:
                        raise RuntimeError(f"the jobs API answered {r.status}: {job}")
                submitted = time.perf_counter()
                final: dict[str, Any] = {}
                async with http.get(f"{url}/v1/jobs/{job['id']}/events") as r:
                    async for line in r.content:
                        if line.startswith(b"data: "):
                            final = json.loads(line[6:])
                if final.get("state") != "succeeded" or not final.get("outputs"):
                    raise RuntimeError(f"the job ended {final.get('state')}")
                streamed = time.perf_counter()
                streamed_at.append(time.time())
                async with http.get(f"{url}/v1/jobs/{job['id']}/outputs/0") as r:
                    if r.status != 200 or not await r.read():
                        raise RuntimeError(f"the output answered {r.status}")
                end = time.perf_counter()
                phases["submit"].append((submitted - start) * 1000)
                phases["stream"].append((streamed - submitted) * 1000)
                phases["download"].append((end - streamed) * 1000)
                return (end - start) * 1000

            async def one_direct() -> float:
                start = time.perf_counter()
                # as `comfyveil generate` runs it: the backend's default no-trace (on),
                # metadata stripped, outputs streamed into --out and saved there
                outcome = await execute.execute(
                    client, wf, wf.validate(VALUES), no_trace=True, out_dir=out_dir
                )
                if not downloads.save_outputs(outcome.files, out_dir):
                    raise RuntimeError("the direct run produced nothing")
                return (time.perf_counter() - start) * 1000

            for _ in range(WARMUP):
                await one_api()
                await one_direct()
                await one_job()
            for i in range(jobs):
                if i % 2:  # take turns, so a slow moment of the machine hits every path
                    api_ms.append(await one_api())
                    jobs_ms.append(await one_job())
                    direct_ms.append(await one_direct())
                else:
                    direct_ms.append(await one_direct())
                    jobs_ms.append(await one_job())
                    api_ms.append(await one_api())
        with contextlib.suppress(TimeoutError):  # the last webhooks on their way
            await asyncio.wait_for(complete.wait(), 30)
        draining.cancel()
        async with (
            await database.Database.open(url=db_url, run_migrations=False) as db,
            db.pool.connection() as conn,
        ):
            rows = await (
                await conn.execute(
                    "SELECT extract(epoch FROM started_at - created_at) * 1000 AS queued, "
                    "extract(epoch FROM finished_at - started_at) * 1000 AS ran, "
                    "extract(epoch FROM created_at) AS created, "
                    "extract(epoch FROM finished_at) AS finished "
                    "FROM jobs WHERE idempotency_key LIKE 'api:%%' "
                    "ORDER BY created_at OFFSET %s",
                    (WARMUP,),
                )
            ).fetchall()
            ended = await (
                await conn.execute(
                    "SELECT id::text AS id, extract(epoch FROM finished_at) AS finished, "
                    "extract(epoch FROM started_at - created_at) * 1000 AS queued, "
                    "extract(epoch FROM finished_at - started_at) * 1000 AS ran "
                    "FROM jobs WHERE idempotency_key LIKE 'apijob:%%' "
                    "ORDER BY created_at OFFSET %s",
                    (WARMUP,),
                )
            ).fetchall()
        # the stream's own share: from the job's end in the jobs table to its final
        # event read by the client (the wake-up, the reads, the event)
        stream_after_ms = [
            (t - float(r["finished"])) * 1000
            for t, r in zip(streamed_at[WARMUP:], ended, strict=True)
        ]
        webhook_ms = [
            (received[r["id"]] - float(r["finished"])) * 1000 for r in ended if r["id"] in received
        ]
        if len(webhook_ms) != len(ended):
            raise RuntimeError(f"{len(ended) - len(webhook_ms)} webhooks never arrived")
        queued_ms = [float(r["queued"]) for r in rows]
        ran_ms = [float(r["ran"]) for r in rows]
        measured = list(zip(stamps[WARMUP:], ends[WARMUP:], rows, strict=True))
        # the API's own share: from sending the request to the job's row (key, desk,
        # policy, enqueue), and from the job's end to the answer read (wake-up, outputs,
        # base64, JSON)
        before_ms = [(float(r["created"]) - t0) * 1000 for t0, _t1, r in measured]
        after_ms = [(t1 - float(r["finished"])) * 1000 for _t0, t1, r in measured]
    finally:
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 60)
            if proc.returncode is None:
                proc.kill()
        await comfy.stop()
        await server.stop()
        await receiver.cleanup()
    added_p50 = statistics.median(api_ms) - statistics.median(direct_ms)
    jobs_added_p50 = statistics.median(jobs_ms) - statistics.median(direct_ms)
    return {
        "benchmark": "api_overhead",
        "jobs": jobs,
        "generate_p50_ms": round(statistics.median(direct_ms), 2),
        "generate_p90_ms": round(pct(direct_ms, 0.9), 2),
        "api_p50_ms": round(statistics.median(api_ms), 2),
        "api_p90_ms": round(pct(api_ms, 0.9), 2),
        "added_p50_ms": round(added_p50, 2),
        "added_p90_ms": round(pct(api_ms, 0.9) - pct(direct_ms, 0.9), 2),
        # where an API job's time went, from the jobs table: queued (created to claimed)
        # and the worker's run (claimed to finished); the rest is the request around them
        "queued_p50_ms": round(statistics.median(queued_ms), 2),
        "worker_run_p50_ms": round(statistics.median(ran_ms), 2),
        "api_before_queue_p50_ms": round(statistics.median(before_ms), 2),
        "api_after_finish_p50_ms": round(statistics.median(after_ms), 2),
        "jobs_api_p50_ms": round(statistics.median(jobs_ms), 2),
        "jobs_api_p90_ms": round(pct(jobs_ms, 0.9), 2),
        "jobs_added_p50_ms": round(jobs_added_p50, 2),
        "jobs_added_p90_ms": round(pct(jobs_ms, 0.9) - pct(direct_ms, 0.9), 2),
        # where a /v1/jobs job's time went (warm-up runs included: they are few)
        **{f"jobs_{k}_p50_ms": round(statistics.median(v), 2) for k, v in phases.items()},
        # the same split for the jobs of /v1/jobs, whose stream runs beside its worker
        "jobs_queued_p50_ms": round(statistics.median(float(r["queued"]) for r in ended), 2),
        "jobs_worker_run_p50_ms": round(statistics.median(float(r["ran"]) for r in ended), 2),
        "jobs_stream_after_finish_p50_ms": round(statistics.median(stream_after_ms), 2),
        "jobs_stream_after_finish_p90_ms": round(pct(stream_after_ms, 0.9), 2),
        "target_added_p50_ms": TARGET_P50_MS,
        "met": added_p50 <= TARGET_P50_MS,
        "jobs_met": jobs_added_p50 <= TARGET_P50_MS,
        "webhook_p50_ms": round(statistics.median(webhook_ms), 2),
        "webhook_p90_ms": round(pct(webhook_ms, 0.9), 2),
        "target_webhook_p50_ms": TARGET_WEBHOOK_P50_MS,
        "webhook_met": statistics.median(webhook_ms) <= TARGET_WEBHOOK_P50_MS,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'path':<34} {'p50 ms':>9} {'p90 ms':>9}")
    print(
        f"{'comfyveil generate (direct)':<34} {result['generate_p50_ms']:>9.1f} "
        f"{result['generate_p90_ms']:>9.1f}"
    )
    print(
        f"{'POST /v1/images/generations':<34} {result['api_p50_ms']:>9.1f} "
        f"{result['api_p90_ms']:>9.1f}"
    )
    print(f"{'added by the API':<34} {result['added_p50_ms']:>9.1f} {result['added_p90_ms']:>9.1f}")
    print(
        f"{'/v1/jobs: submit, SSE, download':<34} {result['jobs_api_p50_ms']:>9.1f} "
        f"{result['jobs_api_p90_ms']:>9.1f}"
    )
    print(
        f"{'added by the jobs API':<34} {result['jobs_added_p50_ms']:>9.1f} "
        f"{result['jobs_added_p90_ms']:>9.1f}"
    )
    for phase in ("submit", "stream", "download"):
        print(f"{'  of which ' + phase:<34} {result[f'jobs_{phase}_p50_ms']:>9.1f}")
    print(
        f"{'    stream: finished to final event':<34} "
        f"{result['jobs_stream_after_finish_p50_ms']:>9.1f} "
        f"{result['jobs_stream_after_finish_p90_ms']:>9.1f}"
    )
    print(
        f"{'webhook: finished to receiver 200':<34} {result['webhook_p50_ms']:>9.1f} "
        f"{result['webhook_p90_ms']:>9.1f}"
    )
    print(f"{'  of which queued (to claim)':<34} {result['queued_p50_ms']:>9.1f}")
    print(f"{'  of which the worker run':<34} {result['worker_run_p50_ms']:>9.1f}")
    print(f"{'  of which request to queued row':<34} {result['api_before_queue_p50_ms']:>9.1f}")
    print(f"{'  of which finished to answer read':<34} {result['api_after_finish_p50_ms']:>9.1f}")
    print(
        f"{result['jobs']} jobs each, one at a time, turns taken; target: added p50 <= "
        f"{TARGET_P50_MS:.0f} ms; met: {result['met']} (images), {result['jobs_met']} (jobs); "
        f"webhook p50 <= {TARGET_WEBHOOK_P50_MS:.0f} ms: {result['webhook_met']}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30)
    args = parser.parse_args()
    warnings.simplefilter("ignore", ResourceWarning)
    outcome = asyncio.run(main(args.jobs))
    print_table(outcome)
    print(json.dumps(outcome))
