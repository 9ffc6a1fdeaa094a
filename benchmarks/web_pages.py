"""The web front end's pages against a bare aiohttp handler doing the same SQL reads.

    .venv/bin/python benchmarks/web_pages.py [--rounds 40] [--users 20]

Setup: an embedded PostgreSQL with the current schema, 20 signed-in accounts with 50
finished jobs each (a small PNG per job). Two applications on 127.0.0.1 share one
database pool:

- **comfyveil**: the web front end as it ships (`comfyveil.web.app.build`): its
  middlewares (headers, session, language, forms' checks), Jinja templates, i18n, the
  access rules.
- **baseline**: one bare aiohttp handler per page, no middleware, which runs the same
  SQL reads through the same store (the visitor's session with its users row in one
  query, then the page's data in one) and renders the same data with `str.format`.
  What a page costs beyond this is what our layers add.

Pages: home (the commands), a finished job's page with its result, the gallery of 50
and the history. A separate load process (so that its own work does not share the
servers' event loop) runs 20 signed-in users at once, each on its own keep-alive
connection: every round, each user asks each page of both applications, in an order that
alternates, so that both meet the same conditions.

Target (issue 25 §4): every page at most 1.5x the baseline at p50 and at p99 of the
round trip; page weight (HTML + the stylesheet, without images) under 30 KB. Prints a
table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import html
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

from comfyveil import config, i18n
from comfyveil.cli.run import settle_heap
from comfyveil.desk import access, language
from comfyveil.desk.words import status_word
from comfyveil.i18n import _
from comfyveil.store import accounts as web_store
from comfyveil.store import database, embedded, web_tables
from comfyveil.web import app as web_app
from comfyveil.web import auth
from comfyveil.web.page import when

RESULTS = 50
WARM_UP = 5  # rounds not counted (templates compiled, plans cached, connections made)
TARGET_RATIO = 1.5
TARGET_WEIGHT = 30 * 1024
HISTORY_ROWS = 24  # as the history page (web/job_pages.py PAGE_SIZE)
GALLERY_ITEMS = 50  # as the gallery page (GALLERY_PAGE)

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

CHROME = (
    '<!doctype html>\n<html lang="{lang}" dir="{dir}">\n<head>\n<meta charset="utf-8">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    '<meta name="referrer" content="no-referrer">\n<title>{title} · comfyveil</title>\n'
    '<link rel="stylesheet" href="/static/style.css">\n</head>\n<body>\n<header>\n'
    '<a class="brand" href="/">comfyveil</a>\n<nav>\n<a href="/">{create}</a>\n'
    '<a href="/history">{history}</a>\n<a href="/gallery">{gallery}</a>\n'
    '<a href="/settings">{settings}</a>\n<form class="inline" method="post" action="/logout">\n'
    '<input type="hidden" name="csrf" value="{csrf}">\n'
    '<button type="submit" class="link">{logout} ({name})</button>\n</form>\n</nav>\n'
    '</header>\n<main>\n{main}\n</main>\n</body>\n</html>'
)


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (512, 512), (40, 90, 160)).save(out, "PNG")
    return out.getvalue()


async def _users(db: database.Database, count: int) -> list[dict[str, Any]]:
    """`count` accounts, each signed in and with RESULTS finished jobs."""
    store = web_tables.WebStore(db.pool)
    png = _png()
    users = []
    passphrases = auth.Passphrases.for_site(config.WebConfig())  # the default cost
    for n in range(count):
        token = await store.create_invite(is_admin=False, hours=1)
        account = await store.sign_up(token, f"bench{n}", await passphrases.hash("x" * 12))
        session, _ = await store.create_session(account.id, hours=1)
        jobs = []
        async with db.pool.connection() as conn:
            for k in range(RESULTS):
                job_id = uuid.uuid4()
                params = json.dumps({"prompt": f"an astronaut, take {k}", "seed": k, "steps": 4})
                await conn.execute(
                    FILL, {"id": job_id, "user": account.user_id, "params": params, "age": k * 60}
                )
                await conn.execute(OUTPUT, {"id": job_id, "data": png, "size": len(png)})
                jobs.append(str(job_id))
        users.append({"session": session, "job": jobs[0]})
    return users


# -- the baseline: bare handlers, the same reads, str.format ------------------------------


def baseline_app(db: database.Database, desk: Any) -> web.Application:
    """The same reads and the same page content as ours, rendered with `str.format`; the
    same helpers for words, times and text direction."""
    store = web_tables.WebStore(db.pool)
    registry = desk.registry
    esc = html.escape

    async def visitor(request: web.Request) -> web_store.Visitor:
        found = await store.session(request.cookies.get(auth.SESSION_COOKIE, ""))
        if found is None:
            raise web.HTTPSeeOther("/login")
        settings = found.user.settings if found.user is not None else None
        i18n.set_language(language.choose(settings, request.headers.get("Accept-Language")))
        return found

    def page(title: str, who: web_store.Visitor, main: str) -> web.Response:
        lang = i18n.current()
        body = CHROME.format(
            lang=lang, dir="rtl" if lang in i18n.RTL else "ltr", title=esc(title),
            create=esc(_("Create")), history=esc(_("History")), gallery=esc(_("Gallery")),
            settings=esc(_("Settings")), logout=esc(_("Log out")), csrf=esc(who.csrf),
            name=esc(who.account.name), main=main,
        )
        return web.Response(text=body, content_type="text/html")

    async def home(request: web.Request) -> web.Response:
        who = await visitor(request)
        rules = access.who_with(desk, who.account, who.user)
        entries = [e for e in await registry.all() if e.allows(rules)]
        items = "".join(
            f'<li><a href="/c/{esc(e.name)}"><strong>{esc(e.title())}</strong></a> '
            f'<bdi class="cmd">/{esc(e.name)}</bdi><br><span class="help">'
            f"{esc(e.description())}</span></li>\n"
            for e in entries
        )
        return page(_("Create"), who,
                    f'<h1>{esc(_("What to make"))}</h1>\n<ul class="commands">\n{items}</ul>')

    async def job(request: web.Request) -> web.Response:
        who = await visitor(request)
        found = await store.job_with_files(uuid.UUID(request.match_info["id"]))
        if found is None or found[0].user_id != who.account.user_id:
            raise web.HTTPNotFound()
        row, outputs, inputs = found
        command = i18n.ltr("/" + row.command)
        shown = "".join(
            f'<figure class="input"><img src="/jobs/{row.id}/in/{index}" alt="{esc(text)}">'
            f"<figcaption>{esc(text)}</figcaption></figure>\n"
            for index, _mime in inputs
            for text in [_("Input image %(n)s") % {"n": index + 1}]
        ) + "".join(
            f'<figure class="result">\n<img src="/jobs/{row.id}/out/{o.index}" alt="'
            f'{esc(_("Result %(n)s of %(command)s") % {"n": o.index + 1, "command": command})}">'
            f'\n<figcaption>\n<a class="button" href="/jobs/{row.id}/out/{o.index}?download=1">'
            f'{esc(_("Download original"))}</a>\n</figcaption>\n</figure>\n'
            for o in outputs
        )
        elapsed = (row.finished_at - row.started_at).total_seconds() if (
            row.finished_at and row.started_at) else 0.0
        main = (
            f'<h1><bdi>/{esc(row.command)}</bdi> <span class="status status-{row.status}">'
            f"{esc(status_word(row.status))}</span></h1>\n"
            f'<p class="prompt" dir="auto">{esc(str(row.params.get("prompt", "")))}</p>\n'
            f'<dl class="facts">\n<dt>{esc(_("Elapsed"))}</dt><dd>'
            f'{esc(_("%(n)s s") % {"n": f"{elapsed:.1f}"})}</dd>\n'
            f'<dt>{esc(_("Seed"))}</dt><dd>{esc(str(row.params.get("seed", "")))}</dd>\n</dl>\n'
            f"{shown}"
            f'<form method="post" action="/jobs/{row.id}/again">\n'
            f'<input type="hidden" name="csrf" value="{esc(who.csrf)}">\n'
            f'<button type="submit">{esc(_("Run again (new seed)"))}</button>\n</form>'
        )
        return page(_("Job %(command)s") % {"command": command}, who, main)

    async def gallery(request: web.Request) -> web.Response:
        who = await visitor(request)
        items = await store.gallery(who.account.user_id, limit=GALLERY_ITEMS + 1, offset=0)
        alt = _("%(command)s of %(when)s")
        tiles = "".join(
            f'<li><a href="/jobs/{i.job_id}"><img src="/jobs/{i.job_id}/thumb/{i.index}" '
            f'alt="{esc(text)}" width="160" height="160"></a></li>\n'
            for i in items[:GALLERY_ITEMS]
            for text in [alt % {"command": i18n.ltr("/" + i.command),
                                "when": i18n.ltr(i.created_at.strftime("%Y-%m-%d %H:%M"))}]
        )
        return page(_("Gallery"), who,
                    f'<h1>{esc(_("Gallery"))}</h1>\n<ul class="gallery">\n{tiles}</ul>')

    async def history(request: web.Request) -> web.Response:
        who = await visitor(request)
        rows = await store.history(who.account.user_id, limit=HISTORY_ROWS + 1, offset=0)
        lines = "".join(
            f'<tr><td><a href="/jobs/{r["id"]}">{when(r["created_at"])}</a></td>'
            f'<td><bdi>/{esc(r["command"])}</bdi></td><td class="prompt" dir="auto">'
            f'{esc(_cut(r["prompt"] or ""))}</td><td>{esc(status_word(r["status"]))}</td></tr>\n'
            for r in rows[:HISTORY_ROWS]
        )
        head = "".join(f'<th scope="col">{esc(_(h))}</th>'
                       for h in ("When (UTC)", "Command", "Prompt", "Status"))
        return page(_("History"), who, f'<h1>{esc(_("History"))}</h1>\n<table>\n<thead><tr>'
                    f"{head}</tr></thead>\n<tbody>\n{lines}</tbody>\n</table>")

    app = web.Application()
    app.router.add_get("/", home)
    app.router.add_get("/jobs/{id}", job)
    app.router.add_get("/gallery", gallery)
    app.router.add_get("/history", history)
    return app


def _cut(text: str, length: int = 80) -> str:
    """Jinja's `truncate(80)`: whole words, an ellipsis, a little leeway."""
    if len(text) <= length + 5:
        return text
    return text[: length - 3].rsplit(" ", 1)[0] + "..."


# -- the load, in a process of its own ------------------------------------------------------


async def load(plan: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Per app and page, the round trips. Each step is one page of one application asked
    by every user at once (each on its own connection); the applications take turns, in
    an order that alternates, so each is measured alone on the event loop they share."""
    trips: dict[str, dict[str, list[float]]] = {app: {} for app in plan["bases"]}
    apps = list(plan["bases"])
    clients = []
    for who in plan["users"]:
        jar = aiohttp.CookieJar(unsafe=True)  # 127.0.0.1: an IP's cookies need unsafe
        jar.update_cookies({auth.SESSION_COOKIE: who["session"]})
        clients.append(aiohttp.ClientSession(cookie_jar=jar))

    async def ask(client: aiohttp.ClientSession, url: str) -> float:
        started = time.perf_counter()
        async with client.get(url, allow_redirects=False) as response:
            await response.read()
            assert response.status == 200, (url, response.status)
        return time.perf_counter() - started

    try:
        for rnd in range(plan["warm_up"] + plan["rounds"]):
            for page in PAGES:
                for app in apps if rnd % 2 == 0 else apps[::-1]:
                    took = await asyncio.gather(*(
                        ask(client, plan["bases"][app] + _path(page, who))
                        for client, who in zip(clients, plan["users"], strict=True)
                    ))
                    if rnd >= plan["warm_up"]:
                        trips[app].setdefault(page, []).extend(took)
    finally:
        for client in clients:
            await client.close()
    return trips


PAGES = ("home", "job page with result", "gallery of 50", "history")


def _path(page: str, who: dict[str, Any]) -> str:
    return {"home": "/", "job page with result": f"/jobs/{who['job']}",
            "gallery of 50": "/gallery", "history": "/history"}[page]


async def _serve(application: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def main(rounds: int, user_count: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="comfyveil-bench-web-"))
    open_for_the_database_user(root / "pg")
    server = embedded.EmbeddedServer(root / "pg")
    runners: list[web.AppRunner] = []
    weights: dict[str, int] = {}
    try:
        db = await database.Database.open(url=await server.start(), max_size=10)
        try:
            await db.commands.seed()
            users = await _users(db, user_count)
            settings = config.Settings(web=config.WebConfig(port=0))
            ours = web_app.build(settings, db)
            for application in (ours, baseline_app(db, web_app.services_of(ours))):
                runner, base = await _serve(application)
                runners.append(runner)
                if application is ours:
                    ours_base = base
                else:
                    baseline_base = base
            css = len(web_app.services_of(ours).stylesheet)
            jar = aiohttp.CookieJar(unsafe=True)
            jar.update_cookies({auth.SESSION_COOKIE: users[0]["session"]})
            async with aiohttp.ClientSession(cookie_jar=jar) as client:
                for page in PAGES:
                    async with client.get(ours_base + _path(page, users[0]),
                                          allow_redirects=False) as response:
                        assert response.status == 200, (page, response.status)
                        weights[page] = len(await response.read()) + css
            settle_heap()  # as `comfyveil run` does once it has started
            plan = {"bases": {"comfyveil": ours_base, "baseline": baseline_base},
                    "users": users, "rounds": rounds, "warm_up": WARM_UP}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--load",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )
            out, _ = await proc.communicate(json.dumps(plan).encode())
            if proc.returncode != 0:
                raise SystemExit(f"the load process failed ({proc.returncode})")
            trips = json.loads(out)
        finally:
            for runner in runners:
                await runner.cleanup()
            await db.close()
    finally:
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for page in PAGES:
        ours_t, base_t = trips["comfyveil"][page], trips["baseline"][page]
        p50, b50 = statistics.median(ours_t), statistics.median(base_t)
        p99, b99 = _p99(ours_t), _p99(base_t)
        rows.append({
            "page": page,
            "p50_ms": p50 * 1000, "baseline_p50_ms": b50 * 1000, "ratio_p50": p50 / b50,
            "p99_ms": p99 * 1000, "baseline_p99_ms": b99 * 1000, "ratio_p99": p99 / b99,
            "weight_bytes": weights[page],
        })
    return {
        "benchmark": "web_pages",
        "users": user_count,
        "rounds": rounds,
        "requests_per_page_and_app": user_count * rounds,
        "pages": rows,
        "worst_ratio_p50": max(r["ratio_p50"] for r in rows),
        "worst_ratio_p99": max(r["ratio_p99"] for r in rows),
        "heaviest_page_bytes": max(r["weight_bytes"] for r in rows),
        "ratio_target_met": all(
            r["ratio_p50"] <= TARGET_RATIO and r["ratio_p99"] <= TARGET_RATIO for r in rows
        ),
        "weight_target_met": all(r["weight_bytes"] < TARGET_WEIGHT for r in rows),
    }


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[-1]


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{'page':<22} {'p50':>8} {'baseline':>9} {'ratio':>6} {'p99':>8} {'baseline':>9} "
        f"{'ratio':>6} {'HTML+CSS':>9}"
    )
    print("-" * 84)
    for r in result["pages"]:
        print(
            f"{r['page']:<22} {r['p50_ms']:>5.2f} ms {r['baseline_p50_ms']:>6.2f} ms "
            f"{r['ratio_p50']:>5.2f}x {r['p99_ms']:>5.1f} ms {r['baseline_p99_ms']:>6.1f} ms "
            f"{r['ratio_p99']:>5.2f}x {r['weight_bytes'] / 1024:>6.1f} KB"
        )
    print(
        f"{result['users']} signed-in users at once, {result['requests_per_page_and_app']} "
        f"round trips per page and application (all users at once, one page of one "
        f"application at a time); targets: at most {TARGET_RATIO:g}x the "
        f"baseline at p50 and p99: {'met' if result['ratio_target_met'] else 'MISSED'} "
        f"(worst {result['worst_ratio_p50']:.2f}x p50, {result['worst_ratio_p99']:.2f}x p99); "
        f"under 30 KB each: {'met' if result['weight_target_met'] else 'MISSED'} (heaviest "
        f"{result['heaviest_page_bytes'] / 1024:.1f} KB)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="timed rounds per user")
    parser.add_argument("--users", type=int, default=20, help="signed-in users at once")
    parser.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.simplefilter("ignore", ResourceWarning)
    if args.load:
        print(json.dumps(asyncio.run(load(json.loads(sys.stdin.read())))))
        raise SystemExit(0)
    outcome = asyncio.run(main(args.rounds, args.users))
    print_table(outcome)
    print(json.dumps(outcome))
