"""Server time of the web front end's pages against a static file of the same app.

    .venv/bin/python benchmarks/web_pages.py [--requests 300]

Setup: an embedded PostgreSQL with the current schema, the web application
(`comfyveil.web.app.build`) on 127.0.0.1 with a timing middleware outside all of the
app's own, one logged-in account with 50 finished jobs (a small PNG each). Pages
measured: a command's form (`/c/f`), a finished job's page with its result, the gallery
of 50 results, and the history; the baseline is the stylesheet, which the same app
serves from memory through the same middlewares (headers, session lookup). Requests go
round-robin over all of them from one keep-alive client, so they share the machine's
conditions.

The stylesheet needs no session, so it touches no database; every page needs at least
two SQL round trips (the session, then its data). The benchmark also times a bare
`SELECT 1` from the app's pool, to show that floor on the machine at hand.

"server" is the time inside the app (the middleware's clock around the handler chain);
"round trip" is what the client waited. Targets (issue 14): a page's p50 server time
under 3x the static file's, page weight (HTML + the stylesheet, without images) under
30 KB. Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from aiohttp import web
from PIL import Image
from tests.fixtures.database import open_for_the_database_user

from comfyveil import config
from comfyveil.store import accounts as web_store
from comfyveil.store import database, embedded
from comfyveil.web import app as web_app
from comfyveil.web import auth

RESULTS = 50
WARM_UP = 20  # rounds not counted (templates compiled, plans cached)
TARGET_RATIO = 3.0
TARGET_WEIGHT = 30 * 1024

FILL = """
INSERT INTO jobs (id, user_id, chat_id, command, workflow_hash, params, status,
                  created_at, started_at, finished_at)
VALUES (%(id)s, %(user)s, %(user)s, 'f', 'bench', %(params)s, 'succeeded',
        now() - make_interval(secs => %(age)s), now() - make_interval(secs => %(age)s + 3),
        now() - make_interval(secs => %(age)s))
"""
OUTPUT = """
INSERT INTO job_outputs (job_id, index, filename, kind, mime, data, size)
VALUES (%(id)s, 0, 'ComfyUI_00001_.png', 'image', 'image/png', %(data)s, %(size)s)
"""


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (512, 512), (40, 90, 160)).save(out, "PNG")
    return out.getvalue()


async def _account(db: database.Database) -> tuple[web_store.Account, str]:
    store = web_store.WebStore(db.pool)
    token = await store.create_invite(is_admin=False, hours=1)
    account = await store.sign_up(token, "bench", await auth.hash_passphrase("x" * 12))
    session, _ = await store.create_session(account.id, hours=1)
    return account, session


async def _fill(db: database.Database, user_id: int) -> list[uuid.UUID]:
    png = _png()
    ids = []
    async with db.pool.connection() as conn:
        for n in range(RESULTS):
            job_id = uuid.uuid4()
            params = json.dumps({"prompt": f"an astronaut, take {n}", "seed": n, "steps": 4})
            await conn.execute(
                FILL, {"id": job_id, "user": user_id, "params": params, "age": n * 60}
            )
            await conn.execute(OUTPUT, {"id": job_id, "data": png, "size": len(png)})
            ids.append(job_id)
    return ids


async def main(requests: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="comfyveil-bench-web-"))
    open_for_the_database_user(root / "pg")
    server = embedded.EmbeddedServer(root / "pg")
    server_times: dict[str, list[float]] = {}
    trips: dict[str, list[float]] = {}
    weights: dict[str, int] = {}
    try:
        db = await database.Database.open(url=await server.start())
        try:
            await db.commands.seed()
            account, session = await _account(db)
            ids = await _fill(db, account.user_id)
            settings = config.Settings(web=config.WebConfig(port=0))
            application = web_app.build(settings, db)
            clock: dict[str, float] = {}

            @web.middleware
            async def timing(request: web.Request, handler: Any) -> web.StreamResponse:
                started = time.perf_counter()
                response = await handler(request)
                clock["took"] = time.perf_counter() - started
                return response

            application.middlewares.insert(0, timing)
            runner = web.AppRunner(application, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            base = f"http://127.0.0.1:{port}"
            pages = {
                "static file (baseline)": "/static/style.css",
                "form /c/f": "/c/f",
                "job page with result": f"/jobs/{ids[0]}",
                "gallery of 50": "/gallery",
                "history": "/history",
            }
            css = len(web_app.services_of(application).stylesheet)
            jar = aiohttp.CookieJar(unsafe=True)
            jar.update_cookies({auth.SESSION_COOKIE: session})
            try:
                async with aiohttp.ClientSession(cookie_jar=jar) as client:
                    for name, path in pages.items():
                        async with client.get(base + path) as response:
                            body = await response.read()
                            assert response.status == 200, (path, response.status)
                        weights[name] = len(body) + (0 if path.endswith(".css") else css)
                    sql_floor: list[float] = []
                    for rnd in range(WARM_UP + requests):
                        started = time.perf_counter()
                        async with db.pool.connection() as conn:
                            await conn.execute("SELECT 1")
                        if rnd >= WARM_UP:
                            sql_floor.append(time.perf_counter() - started)
                        for name, path in pages.items():
                            started = time.perf_counter()
                            async with client.get(base + path) as response:
                                await response.read()
                            trip = time.perf_counter() - started
                            if rnd >= WARM_UP:
                                server_times.setdefault(name, []).append(clock["took"])
                                trips.setdefault(name, []).append(trip)
            finally:
                await runner.cleanup()
        finally:
            await db.close()
    finally:
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)
    base_p50 = statistics.median(server_times["static file (baseline)"])
    base_trip = statistics.median(trips["static file (baseline)"])
    rows = []
    for name in pages:
        p50 = statistics.median(server_times[name])
        rows.append(
            {
                "page": name,
                "server_p50_ms": p50 * 1000,
                "server_p90_ms": statistics.quantiles(server_times[name], n=10)[-1] * 1000,
                "round_trip_p50_ms": statistics.median(trips[name]) * 1000,
                "ratio_to_static": p50 / base_p50,
                "round_trip_ratio_to_static": statistics.median(trips[name]) / base_trip,
                "weight_bytes": weights[name],
            }
        )
    pages_only = [r for r in rows if r["page"] != "static file (baseline)"]
    return {
        "benchmark": "web_pages",
        "requests_per_page": requests,
        "results": RESULTS,
        "sql_round_trip_p50_ms": statistics.median(sql_floor) * 1000,
        "pages": rows,
        "worst_ratio_to_static": max(r["ratio_to_static"] for r in pages_only),
        "heaviest_page_bytes": max(r["weight_bytes"] for r in pages_only),
        "worst_round_trip_ratio": max(r["round_trip_ratio_to_static"] for r in pages_only),
        "ratio_target_met": all(r["ratio_to_static"] < TARGET_RATIO for r in pages_only),
        "round_trip_ratio_target_met": all(
            r["round_trip_ratio_to_static"] < TARGET_RATIO for r in pages_only
        ),
        "weight_target_met": all(r["weight_bytes"] < TARGET_WEIGHT for r in pages_only),
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{'page':<24} {'server p50':>10} {'p90':>8} {'vs static':>9} {'round trip':>10} "
        f"{'vs static':>9} {'HTML+CSS':>9}"
    )
    print("-" * 86)
    for r in result["pages"]:
        print(
            f"{r['page']:<24} {r['server_p50_ms']:>7.2f} ms {r['server_p90_ms']:>5.2f} ms "
            f"{r['ratio_to_static']:>8.1f}x {r['round_trip_p50_ms']:>7.2f} ms "
            f"{r['round_trip_ratio_to_static']:>8.2f}x {r['weight_bytes'] / 1024:>6.1f} KB"
        )
    print(
        f"one SQL round trip from the app's pool (SELECT 1): "
        f"{result['sql_round_trip_p50_ms']:.2f} ms p50; every page needs at least two "
        "(the session, then its data), the stylesheet none"
    )
    print(
        f"targets: p50 under {TARGET_RATIO:g}x the static file: "
        f"{'met' if result['ratio_target_met'] else 'MISSED'} (worst "
        f"{result['worst_ratio_to_static']:.2f}x), by round trip: "
        f"{'met' if result['round_trip_ratio_target_met'] else 'MISSED'} (worst "
        f"{result['worst_round_trip_ratio']:.2f}x); under 30 KB each: "
        f"{'met' if result['weight_target_met'] else 'MISSED'} (heaviest "
        f"{result['heaviest_page_bytes'] / 1024:.1f} KB); "
        f"{result['requests_per_page']} requests per page"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="timed requests per page")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ResourceWarning)
    outcome = asyncio.run(main(args.requests))
    print_table(outcome)
    print(json.dumps(outcome))
