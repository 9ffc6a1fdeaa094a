"""HTTP client CPU per request: httpx (what we used) against aiohttp (what we use now).

    .venv/bin/python benchmarks/http_client_cpu.py [--requests 1500] [--rounds 3]

The bot spends its CPU on a handful of HTTP calls per job, so the client library's own
cost per call is a large part of it. Two calls are measured, each with both libraries,
against the same server on 127.0.0.1 running in a child process (so only the client's
CPU is counted, read with getrusage):

- ComfyUI ``POST /prompt`` with a workflow of a dozen nodes: a bare ``httpx.AsyncClient``
  (as `ComfyClient` used it, one client kept open) against `comfy.transport.Http`.
- Bot API ``sendPhoto`` with a 20 KB image, through python-telegram-bot's ``Bot`` (its
  request building and answer parsing are the same in both rows): PTB's own
  ``HTTPXRequest`` against our `telegram.request.AiohttpRequest`.

Each figure is the median over `--rounds` interleaved runs. Ratio = httpx CPU / aiohttp
CPU (above 1: aiohttp is cheaper). Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("PTB_TIMEDELTA", "true")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import telegram
from PIL import Image
from telegram.request import HTTPXRequest

from comfyveil.comfy import transport
from comfyveil.telegram.request import AiohttpRequest

TOKEN = "123456:bench"
SERVER = r"""
import sys
from aiohttp import web

USER = {"id": 1, "is_bot": True, "first_name": "Bench", "username": "BenchBot"}
MESSAGE = {"message_id": 7, "date": 0, "chat": {"id": 1, "type": "private"}, "from": USER,
           "photo": [{"file_id": "f", "file_unique_id": "u", "width": 64, "height": 64}]}

async def prompt(request):
    await request.read()
    return web.json_response({"prompt_id": "p" * 36, "number": 1, "node_errors": {}})

async def bot(request):
    await request.read()
    method = request.match_info["method"]
    result = USER if method == "getMe" else MESSAGE
    return web.json_response({"ok": True, "result": result})

app = web.Application(client_max_size=16 * 1024 * 1024)
app.router.add_post("/prompt", prompt)
app.router.add_post("/bot{token}/{method}", bot)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def workflow() -> dict[str, Any]:
    return {
        str(i): {"class_type": f"Node{i}",
                 "inputs": {"seed": i * 7919, "text": "a red fox in snow " * 4, "steps": 4}}
        for i in range(12)
    }


def photo() -> bytes:
    out = io.BytesIO()
    Image.effect_noise((96, 96), 64).convert("RGB").save(out, "PNG")
    return out.getvalue()


async def per_request(call: Callable[[], Awaitable[object]], count: int) -> float:
    """CPU seconds per call, after a warm-up."""
    for _ in range(min(50, count)):
        await call()
    started = cpu_s()
    for _ in range(count):
        await call()
    return (cpu_s() - started) / count


async def prompt_httpx(base: str, count: int) -> float:
    body = {"prompt": workflow(), "prompt_id": "p" * 36, "client_id": "c" * 32}
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        async def call() -> None:
            response = await client.post(base + "/prompt", json=body)
            response.json()
        return await per_request(call, count)


async def prompt_aiohttp(base: str, count: int) -> float:
    body = {"prompt": workflow(), "prompt_id": "p" * 36, "client_id": "c" * 32}
    http = transport.Http(backend="bench", timeout=30)
    try:
        async def call() -> None:
            reply = await http.request("POST", base + "/prompt", json=body)
            json.loads(reply.body)
        return await per_request(call, count)
    finally:
        await http.aclose()


async def send_photo(base: str, count: int, request: Any) -> float:
    data = photo()
    bot = telegram.Bot(TOKEN, base_url=f"{base}/bot", request=request)
    async with bot:
        async def call() -> None:
            await bot.send_photo(1, data, caption="/f a red fox in snow · seed 42")
        return await per_request(call, count)


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.terminate()
                raise RuntimeError("the bench server did not start") from None
            time.sleep(0.1)


async def measure(base: str, count: int, rounds: int) -> dict[str, Any]:
    cases: dict[str, dict[str, Callable[[], Awaitable[float]]]] = {
        "ComfyUI POST /prompt": {
            "httpx": lambda: prompt_httpx(base, count),
            "aiohttp": lambda: prompt_aiohttp(base, count),
        },
        "Bot API sendPhoto (PTB)": {
            "httpx": lambda: send_photo(base, count // 2, HTTPXRequest()),
            "aiohttp": lambda: send_photo(base, count // 2, AiohttpRequest()),
        },
    }
    samples: dict[str, dict[str, list[float]]] = {
        case: {lib: [] for lib in libs} for case, libs in cases.items()
    }
    for _ in range(rounds):
        for case, libs in cases.items():
            for lib, run in libs.items():
                samples[case][lib].append(await run())
    rows = []
    for case, libs in samples.items():
        httpx_ms = statistics.median(libs["httpx"]) * 1000
        aiohttp_ms = statistics.median(libs["aiohttp"]) * 1000
        rows.append({"case": case, "httpx_ms": httpx_ms, "aiohttp_ms": aiohttp_ms,
                     "ratio": httpx_ms / aiohttp_ms})
    return {"benchmark": "http_client_cpu", "requests": count, "rounds": rounds,
            "unit": "ms of client CPU per request", "rows": rows}


def print_table(result: dict[str, Any]) -> None:
    print(f"{'call':<26}{'httpx':>10}{'aiohttp':>10}{'ratio':>8}")
    print("-" * 54)
    for row in result["rows"]:
        print(f"{row['case']:<26}{row['httpx_ms']:>8.3f}ms{row['aiohttp_ms']:>8.3f}ms"
              f"{row['ratio']:>7.2f}x")
    print(f"client CPU per request (getrusage), median of {result['rounds']} rounds; "
          "server in a child process on 127.0.0.1")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server, base = start_server()
    try:
        outcome = asyncio.run(measure(base, args.requests, args.rounds))
    finally:
        server.terminate()
        server.wait(10)
    print_table(outcome)
    print(json.dumps(outcome))
