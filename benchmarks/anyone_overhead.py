"""Anyone overhead: one job direct vs through a hidden service on a private network.

    .venv/bin/python benchmarks/anyone_overhead.py [--runs 5] [--requests 20]

The job is what `comfyveil generate` does: upload a ~1 MB noisy PNG over HTTP, submit a
model-free workflow (LoadImage -> SaveImage), follow it over the WebSocket, download the
~1 MB PNG it saved. The same FakeComfyUI serves it directly (the baseline) and as a
hidden service with client authorization, reached through our anon's SOCKS port, on a
private Anyone network started here: 3 directory authorities, 5 relays, a GPU-host anon
and a client anon, all on 127.0.0.1 (the test suite's builder, tests/fixtures/anyone.py).

Safety: the script re-runs itself under scripts/loopback-only (a network namespace with
only loopback, where the machine allows it), sets COMFYVEIL_ANYONE_FORBID_PUBLIC=1 and
passes the private network explicitly; nothing can reach the public network.
Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
_MARK = "COMFYVEIL_BENCH_LOOPBACK_ONLY"
if __name__ == "__main__" and not os.environ.get(_MARK):
    os.environ[_MARK] = "1"
    os.execv(str(REPO / "scripts" / "loopback-only"),
             [str(REPO / "scripts" / "loopback-only"), sys.executable, *sys.argv])

os.environ["COMFYVEIL_ANYONE_FORBID_PUBLIC"] = "1"

from PIL import Image  # noqa: E402
from tests.fakes.comfyui import FakeComfyUI  # noqa: E402
from tests.fixtures import anyone as anyone_fixtures  # noqa: E402

from comfyveil import config  # noqa: E402
from comfyveil.anyone import hidden, process, runtime  # noqa: E402
from comfyveil.comfy import client as comfy_client  # noqa: E402
from comfyveil.comfy import errors as comfy_errors  # noqa: E402
from comfyveil.comfy import execute, workflow  # noqa: E402

WORKFLOW = REPO / "tests" / "data" / "noise_copy.toml"
SIDE = 600  # 600 x 600 RGB noise: a PNG of about 1.08 MB


def noisy_png() -> bytes:
    image = Image.frombytes("RGB", (SIDE, SIDE), os.urandom(SIDE * SIDE * 3))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


async def one_job(client: comfy_client.ComfyClient, wf: workflow.Workflow) -> dict[str, float]:
    image = execute.InputImage(await asyncio.to_thread(noisy_png))
    values = wf.validate({"image": image.upload_name})
    started = time.perf_counter()
    outcome = await execute.execute(client, wf, values, {"image": image}, timeout=120)
    total = time.perf_counter() - started
    moved = len(image.data) + sum(len(f.data) for f in outcome.files)
    if not outcome.files or len(outcome.files[0].data) < 1_000_000:
        raise RuntimeError("the job did not return a ~1 MB image")
    return {"total_s": total, "upload_s": outcome.upload_seconds,
            "run_s": outcome.run_seconds, "download_s": outcome.download_seconds,
            "bytes": float(moved)}


async def small_requests(client: comfy_client.ComfyClient, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await client.system_stats()
        times.append(time.perf_counter() - started)
    return times


async def warm_up(client: comfy_client.ComfyClient, anon: process.AnonClient | None) -> None:
    """The first request to a hidden service may fail while its descriptor is fetched."""
    for attempt in range(5):
        try:
            await client.system_stats()
            return
        except comfy_errors.ComfyError:
            if attempt == 4:
                raise
            if isinstance(anon, process.ManagedAnon):
                await anon.new_identity()
            await asyncio.sleep(1)


async def measure(client: comfy_client.ComfyClient, wf: workflow.Workflow, runs: int,
                  requests: int, anon: process.AnonClient | None = None) -> dict[str, Any]:
    await warm_up(client, anon)
    await one_job(client, wf)  # warm-up: the WebSocket, the circuit, the descriptor
    jobs = [await one_job(client, wf) for _ in range(runs)]
    return {"jobs": jobs, "requests": await small_requests(client, requests)}


def summary(data: dict[str, Any]) -> dict[str, float]:
    jobs = data["jobs"]
    med = {k: statistics.median(j[k] for j in jobs) for k in ("total_s", "upload_s",
                                                               "run_s", "download_s")}
    total_bytes = sum(j["bytes"] for j in jobs)
    total_time = sum(j["upload_s"] + j["download_s"] for j in jobs)
    return {**med, "request_ms": statistics.median(data["requests"]) * 1000,
            "throughput_mb_s": total_bytes / total_time / 1e6}


async def main(runs: int, requests: int) -> dict[str, Any]:
    anon_dir = anyone_fixtures.ANON_DIR
    if anon_dir is None:
        raise SystemExit("anon is not installed: run `comfyveil anon install --dir .venv/anon`")
    wf = workflow.load(WORKFLOW)
    with tempfile.TemporaryDirectory(prefix="anyone-bench-") as tmp:
        base = Path(tmp)
        net = anyone_fixtures.PrivateAnyoneNetwork(anon_dir, base / "net")
        fake = FakeComfyUI(root=base / "comfyui", cache=False)
        gpu_host: process.ManagedAnon | None = None
        started = time.perf_counter()
        try:
            await net.start()
            assert net.network is not None
            await fake.start()
            gpu_host = process.ManagedAnon(network=net.network, binary=net.binary,
                                           data_dir=base / "gpu-host", bootstrap_timeout=120)
            private, public = hidden.generate_keypair()
            settings = config.from_mapping(
                {"data_dir": str(base / "bot"), "anyone": {"binary": str(net.binary)}},
                environ={},
            )
            await gpu_host.start()
            address = await gpu_host.add_ephemeral(
                f"127.0.0.1:{fake.port}", client_auth_v3=[hidden.public_key_b32(public)])
            key_file = base / "keys" / "bot.auth_private"
            hidden.write_client_key_file(key_file, hidden.split_address(address)[0], private)
            backend = config.BackendConfig("hidden", f"http://{address}", auth_key_file=key_file)
            async with runtime.anon_for(settings, [backend], network=net.network) as router:
                ready_s = time.perf_counter() - started
                print(f"private network, both anon clients and the hidden service ready in "
                      f"{ready_s:.1f} s", file=sys.stderr)
                async with comfy_client.ComfyClient(fake.url, name="direct") as client:
                    direct = await measure(client, wf, runs, requests)
                async with comfy_client.ComfyClient(
                    backend.url, name="hidden", proxy=router.proxy_for(backend), timeout=60,
                ) as client:
                    hidden_run = await measure(client, wf, runs, requests, router.anon)
        finally:
            if gpu_host is not None:
                await gpu_host.close()
            await fake.stop()
            await net.stop()
    d, h = summary(direct), summary(hidden_run)
    return {
        "runs": runs, "image_bytes": int(direct["jobs"][0]["bytes"] / 2),
        "direct": d, "anyone": h,
        "latency_ratio": h["total_s"] / d["total_s"],
        "request_latency_ratio": h["request_ms"] / d["request_ms"],
        "throughput_ratio": h["throughput_mb_s"] / d["throughput_mb_s"],
        "setup_s": ready_s,
    }


def table(result: dict[str, Any]) -> str:
    d, h = result["direct"], result["anyone"]
    rows = [
        ("job: upload + run + download (s, median)", d["total_s"], h["total_s"]),
        ("  upload ~1 MB (s)", d["upload_s"], h["upload_s"]),
        ("  submit + WebSocket events until done (s)", d["run_s"], h["run_s"]),
        ("  download ~1 MB (s)", d["download_s"], h["download_s"]),
        ("GET /system_stats (ms, median)", d["request_ms"], h["request_ms"]),
        ("image throughput (MB/s)", d["throughput_mb_s"], h["throughput_mb_s"]),
    ]
    lines = [f"{'':44} {'direct':>10} {'anyone':>10} {'ratio':>8}"]
    for label, a, b in rows:
        lines.append(f"{label:44} {a:10.3f} {b:10.3f} {b / a:8.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured jobs per route")
    parser.add_argument("--requests", type=int, default=20,
                        help="small HTTP requests per route")
    opts = parser.parse_args()
    figures = asyncio.run(main(opts.runs, opts.requests))
    print(table(figures))
    print(f"\njob latency through anon: {figures['latency_ratio']:.2f}x direct; "
          f"throughput {figures['anyone']['throughput_mb_s']:.2f} MB/s vs "
          f"{figures['direct']['throughput_mb_s']:.2f} MB/s")
    print(json.dumps(figures))
