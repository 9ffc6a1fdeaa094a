"""Anyone overhead: one job direct vs through a hidden service on a private network.

    .venv/bin/python benchmarks/anyone_overhead.py [--runs 5] [--requests 20]

The job is what `comfyveil generate` does: upload a ~1 MB noisy PNG over HTTP, submit a
model-free workflow (LoadImage -> SaveImage), follow it over the WebSocket, download the
~1 MB PNG it saved. Then a 20 MB result (a video's size) is downloaded twice in turn:
by our client (`ComfyClient.download`) and by the leanest possible reader, a bare socket
through the same SOCKS stream reading 1 MiB at a time: that is the circuit's throughput,
the ceiling for anything we could do in our reads and writes.

Found (2026-12-05, 2 shared cores): the bare socket gets no more than our client (2.6
against 2.9 MB/s for 20 MB; 1 MB alone 1.7-3.2 MB/s either way, the circuit's window
still opening), two streams on one circuit share it (3.0-3.3 MB/s together), two
circuits get 4.1-4.7 MB/s together, and the machine sits at 0 % idle with ten anon
processes relaying every cell: the time is the circuit's (anon's relays on these CPUs),
not our chunking, buffers or round trips (upload, POST /prompt, GET /view: three, on
one kept-alive connection, the WebSocket open already). The per-job cost is then about
the bytes moved at the circuit's rate (2.16 MB / 2.6 MB/s = 0.83 s).

The same FakeComfyUI serves it directly (the baseline) and as a hidden service with
client authorization, reached through our anon's SOCKS port, on a private Anyone network
started here: 3 directory authorities, 5 relays, a GPU-host anon and a client anon,
all on 127.0.0.1 (the test suite's builder, tests/fixtures/anyone.py).

Edits (`--edit-runs`, 0 to skip): a /qwen-shaped job (LoadImage -> ImageScaleToTotalPixels
1 MP -> SaveImage, tests/data/scale_copy) through the hidden service with a 12-megapixel
JPEG photo and a 4-megapixel PNG screenshot, today's way (the input uploaded as it came)
and the new (scaled to the 1 megapixel the workflow uses before the upload, `comfy.fit`
and `comfy.shrink`), alternating on the same circuit. Beside each, the circuit's floor:
the job's bytes (upload + the 1-megapixel PNG result) over the bare socket's throughput
measured in the same run. The photo is synthetic: octaves of noise whose contrast falls
with their size as a photo's does, a 12-megapixel JPEG of about 4.5 MB as a phone's is;
the screenshot is a photo in an app's frame, text beside it.

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
import socket
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
    os.execv(
        str(REPO / "scripts" / "loopback-only"),
        [str(REPO / "scripts" / "loopback-only"), sys.executable, *sys.argv],
    )

os.environ["COMFYVEIL_ANYONE_FORBID_PUBLIC"] = "1"

from PIL import Image  # noqa: E402
from tests.fakes.comfyui import FakeComfyUI  # noqa: E402
from tests.fixtures import anyone as anyone_fixtures  # noqa: E402
from tests.fixtures.photos import phone_jpeg, screenshot_png  # noqa: E402

from comfyveil import config, config_load  # noqa: E402
from comfyveil import proxy as proxy_mod  # noqa: E402
from comfyveil.anyone import daemon, hidden, process, runtime  # noqa: E402
from comfyveil.comfy import client as comfy_client  # noqa: E402
from comfyveil.comfy import errors as comfy_errors  # noqa: E402
from comfyveil.comfy import execute, fit, shrink, uploads, workflow  # noqa: E402
from comfyveil.comfy.results import OutputFile  # noqa: E402

WORKFLOW = REPO / "tests" / "data" / "noise_copy.toml"
EDIT_WORKFLOW = REPO / "tests" / "data" / "scale_copy.toml"
SIDE = 600  # 600 x 600 RGB noise: a PNG of about 1.08 MB
BIG = 20_000_000  # bytes of the video-sized result
BIG_NAME = "big-result.bin"


def noisy_png() -> bytes:
    image = Image.frombytes("RGB", (SIDE, SIDE), os.urandom(SIDE * SIDE * 3))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


async def one_job(client: comfy_client.ComfyClient, wf: workflow.Workflow) -> dict[str, float]:
    image = uploads.InputImage(await asyncio.to_thread(noisy_png))
    values = wf.validate({"image": image.upload_name})
    started = time.perf_counter()
    outcome = await execute.execute(client, wf, values, {"image": image}, timeout=120)
    total = time.perf_counter() - started
    moved = len(image.data) + sum(len(f.data) for f in outcome.files)
    if not outcome.files or len(outcome.files[0].data) < 1_000_000:
        raise RuntimeError("the job did not return a ~1 MB image")
    return {
        "total_s": total,
        "upload_s": outcome.upload_seconds,
        "run_s": outcome.run_seconds,
        "download_s": outcome.download_seconds,
        "bytes": float(moved),
    }


async def _as_it_came(
    wf: workflow.Workflow,
    values: Any,
    inputs: Any,
    max_pixels: int,
) -> dict[str, uploads.InputImage]:
    return dict(inputs)  # today's code: every input uploaded as the user sent it


def _cpu_seconds(data: bytes, need: fit.Fit) -> float:
    """The CPU time scaling `data` takes: what it costs on an idle core, whatever the
    load of this machine (the wall time is printed too)."""
    started = time.thread_time()
    shrink.shrink(data, need, max_pixels=50_000_000)
    return time.thread_time() - started


async def edit_job(
    client: comfy_client.ComfyClient,
    wf: workflow.Workflow,
    image: uploads.InputImage,
    *,
    new: bool,
) -> dict[str, float]:
    """One edit, today's way or the new; the bytes that went up and came back."""
    sent: list[int] = []
    upload = client.upload_image

    async def counted(data: bytes, *args: Any, **kwargs: Any) -> Any:
        sent.append(len(data))
        return await upload(data, *args, **kwargs)

    client.upload_image = counted  # type: ignore[method-assign]
    fitted = uploads.fit_inputs
    if not new:
        uploads.fit_inputs = _as_it_came  # type: ignore[assignment]
    try:
        values = wf.validate({"image": image.upload_name})
        started = time.perf_counter()
        outcome = await execute.execute(client, wf, values, {"image": image}, timeout=300)
        total = time.perf_counter() - started
    finally:
        uploads.fit_inputs = fitted  # type: ignore[assignment]
        del client.upload_image
    result = sum(len(f.data) for f in outcome.files)
    return {
        "total_s": total,
        "fit_s": outcome.fit_seconds,
        "upload_s": outcome.upload_seconds,
        "download_s": outcome.download_seconds,
        "circuit_s": total - outcome.fit_seconds,
        "up_bytes": float(sum(sent)),
        "result_bytes": float(result),
    }


async def edits(
    client: comfy_client.ComfyClient, wf: workflow.Workflow, runs: int
) -> dict[str, Any]:
    """Each input through the hidden service, today's way and the new in turn."""
    found: dict[str, Any] = {}
    for name, make, mime in (
        ("photo_12mp_jpeg", phone_jpeg, "image/jpeg"),
        ("screenshot_4mp_png", screenshot_png, "image/png"),
    ):
        image = uploads.InputImage(await asyncio.to_thread(make), mime)
        need = fit.fit_for(wf.apply({}), wf.params["image"])
        started = time.perf_counter()
        shrink_cpu_s = await asyncio.to_thread(_cpu_seconds, image.data, need)
        shrink_s = time.perf_counter() - started
        await edit_job(client, wf, image, new=True)  # warm-up: both names uploaded once
        await edit_job(client, wf, image, new=False)
        old, new = [], []
        for _ in range(runs):
            old.append(await edit_job(client, wf, image, new=False))
            new.append(await edit_job(client, wf, image, new=True))
        found[name] = {
            "input_bytes": len(image.data),
            "shrink_s": shrink_s,
            "shrink_cpu_s": shrink_cpu_s,
            "old": old,
            "new": new,
        }
    return found


async def small_requests(client: comfy_client.ComfyClient, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await client.system_stats()
        times.append(time.perf_counter() - started)
    return times


async def raw_get(host: str, port: int, proxy: str | None, path: str) -> tuple[int, float]:
    """Bytes read and seconds from the request to the last byte, through a bare socket
    (through the SOCKS stream when `proxy`): nothing between the circuit and us."""
    loop = asyncio.get_running_loop()
    if proxy is None:
        sock = socket.create_connection((host, port))
    else:
        sock = await proxy_mod.tunnel(proxy, host, port, timeout=60)
    try:
        sock.setblocking(False)
        started = time.perf_counter()
        request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        await loop.sock_sendall(sock, request.encode())
        received = 0
        while chunk := await loop.sock_recv(sock, 1 << 20):
            received += len(chunk)
        return received, time.perf_counter() - started
    finally:
        sock.close()


async def big_results(
    client: comfy_client.ComfyClient, host: str, port: int, proxy: str | None, runs: int
) -> dict[str, list[float]]:
    """MB/s for the 20 MB result, ours and the bare socket's, alternating (same load)."""
    path = f"/view?filename={BIG_NAME}&type=output"
    big = OutputFile("9", BIG_NAME, "", "output", "other")
    ours, circuit = [], []
    for _ in range(runs):
        started = time.perf_counter()
        data = await client.download(big)
        ours.append(len(data) / (time.perf_counter() - started) / 1e6)
        received, seconds = await raw_get(host, port, proxy, path)
        if received < BIG:
            raise RuntimeError("the bare socket did not get the whole result")
        circuit.append(BIG / seconds / 1e6)
    return {"ours": ours, "circuit": circuit}


async def warm_up(client: comfy_client.ComfyClient, anon: daemon.AnonClient | None) -> None:
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


async def measure(
    client: comfy_client.ComfyClient,
    wf: workflow.Workflow,
    runs: int,
    requests: int,
    where: tuple[str, int, str | None],
    anon: daemon.AnonClient | None = None,
) -> dict[str, Any]:
    await warm_up(client, anon)
    await one_job(client, wf)  # warm-up: the WebSocket, the circuit, the descriptor
    jobs = [await one_job(client, wf) for _ in range(runs)]
    return {
        "jobs": jobs,
        "requests": await small_requests(client, requests),
        "big": await big_results(client, *where, runs=max(2, runs // 2)),
    }


def edit_summary(found: dict[str, Any], circuit_mb_s: float) -> dict[str, Any]:
    """Medians of each edit case, today's and the new, with the circuit's floor."""
    out: dict[str, Any] = {}
    for name, case in found.items():
        row: dict[str, Any] = {
            "input_bytes": case["input_bytes"],
            "shrink_s": case["shrink_s"],
            "shrink_cpu_s": case["shrink_cpu_s"],
        }
        for way in ("old", "new"):
            jobs = case[way]
            med = {k: statistics.median(j[k] for j in jobs) for k in jobs[0]}
            moved = med["up_bytes"] + med["result_bytes"]
            row[way] = {**med, "floor_s": moved / (circuit_mb_s * 1e6)}
        row["ratio"] = row["new"]["total_s"] / row["old"]["total_s"]
        row["circuit_ratio"] = row["new"]["circuit_s"] / row["old"]["circuit_s"]
        row["floor_ratio"] = row["new"]["floor_s"] / row["old"]["floor_s"]
        # The job with its scaling at the CPU time it takes (a bot with a core to spare).
        row["idle_core_ratio"] = (row["new"]["circuit_s"] + row["shrink_cpu_s"]) / row["old"][
            "total_s"
        ]
        row["upload_ratio"] = row["new"]["upload_s"] / row["old"]["upload_s"]
        out[name] = row
    return out


def summary(data: dict[str, Any]) -> dict[str, float]:
    jobs = data["jobs"]
    med = {
        k: statistics.median(j[k] for j in jobs)
        for k in ("total_s", "upload_s", "run_s", "download_s")
    }
    total_bytes = sum(j["bytes"] for j in jobs)
    total_time = sum(j["upload_s"] + j["download_s"] for j in jobs)
    return {
        **med,
        "request_ms": statistics.median(data["requests"]) * 1000,
        "throughput_mb_s": total_bytes / total_time / 1e6,
        "big_ours_mb_s": statistics.median(data["big"]["ours"]),
        "big_circuit_mb_s": statistics.median(data["big"]["circuit"]),
    }


async def main(runs: int, requests: int, edit_runs: int) -> dict[str, Any]:
    anon_dir = anyone_fixtures.ANON_DIR
    if anon_dir is None:
        raise SystemExit("anon is not installed: run `comfyveil anon install --dir .venv/anon`")
    wf = workflow.load(WORKFLOW)
    edit_wf = workflow.load(EDIT_WORKFLOW)
    found: dict[str, Any] = {}
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
            fake.dirs["output"].mkdir(parents=True, exist_ok=True)
            (fake.dirs["output"] / BIG_NAME).write_bytes(os.urandom(BIG))
            gpu_host = process.ManagedAnon(
                network=net.network,
                binary=net.binary,
                data_dir=base / "gpu-host",
                bootstrap_timeout=120,
            )
            private, public = hidden.generate_keypair()
            settings = config_load.from_mapping(
                {"data_dir": str(base / "bot"), "anyone": {"binary": str(net.binary)}},
                environ={},
            )
            await gpu_host.start()
            address = await gpu_host.add_ephemeral(
                f"127.0.0.1:{fake.port}", client_auth_v3=[hidden.public_key_b32(public)]
            )
            key_file = base / "keys" / "bot.auth_private"
            hidden.write_client_key_file(key_file, hidden.split_address(address)[0], private)
            backend = config.BackendConfig("hidden", f"http://{address}", auth_key_file=key_file)
            async with runtime.anon_for(settings, [backend], network=net.network) as router:
                ready_s = time.perf_counter() - started
                print(
                    f"private network, both anon clients and the hidden service ready in "
                    f"{ready_s:.1f} s",
                    file=sys.stderr,
                )
                async with comfy_client.ComfyClient(fake.url, name="direct") as client:
                    direct = await measure(
                        client, wf, runs, requests, ("127.0.0.1", fake.port, None)
                    )
                proxy = router.proxy_for(backend)
                async with comfy_client.ComfyClient(
                    backend.url,
                    name="hidden",
                    proxy=proxy,
                    timeout=60,
                ) as client:
                    hidden_run = await measure(
                        client, wf, runs, requests, (address, 80, proxy), router.anon
                    )
                    if edit_runs:
                        found = await edits(client, edit_wf, edit_runs)
        finally:
            if gpu_host is not None:
                await gpu_host.close()
            await fake.stop()
            await net.stop()
    d, h = summary(direct), summary(hidden_run)
    return {
        "runs": runs,
        "image_bytes": int(direct["jobs"][0]["bytes"] / 2),
        "direct": d,
        "anyone": h,
        "latency_ratio": h["total_s"] / d["total_s"],
        "request_latency_ratio": h["request_ms"] / d["request_ms"],
        "throughput_ratio": h["throughput_mb_s"] / d["throughput_mb_s"],
        "added_s": h["total_s"] - d["total_s"],
        "big_share_of_circuit": h["big_ours_mb_s"] / h["big_circuit_mb_s"],
        "setup_s": ready_s,
        "edits": edit_summary(found, h["big_circuit_mb_s"]) if found else {},
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
        ("20 MB result, our client (MB/s, median)", d["big_ours_mb_s"], h["big_ours_mb_s"]),
        ("20 MB result, bare socket (MB/s, median)", d["big_circuit_mb_s"], h["big_circuit_mb_s"]),
    ]
    lines = [f"{'':44} {'direct':>10} {'anyone':>10} {'ratio':>8}"]
    for label, a, b in rows:
        lines.append(f"{label:44} {a:10.3f} {b:10.3f} {b / a:8.2f}")
    for name, row in result["edits"].items():
        o, n = row["old"], row["new"]
        lines.append("")
        lines.append(
            f"edit through anon, {name} ({row['input_bytes'] / 1e6:.2f} MB; scaling it "
            f"took {row['shrink_s']:.2f} s, {row['shrink_cpu_s']:.2f} s of CPU)"
        )
        lines.append(f"{'':44} {'today':>10} {'new':>10} {'ratio':>8}")
        for label, key, scale in (
            ("job: upload + run + download (s, median)", "total_s", 1),
            ("  scaling the input down (s, wall)", "fit_s", 1),
            ("  job less the scaling (s)", "circuit_s", 1),
            ("  upload (s)", "upload_s", 1),
            ("  download (s)", "download_s", 1),
            ("  circuit floor: bytes / throughput (s)", "floor_s", 1),
            ("  uploaded (MB)", "up_bytes", 1e-6),
            ("  result (MB)", "result_bytes", 1e-6),
        ):
            a, b = o[key] * scale, n[key] * scale
            ratio = f"{b / a:8.2f}" if a > 1e-3 else f"{'-':>8}"
            lines.append(f"{label:44} {a:10.3f} {b:10.3f} {ratio}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured jobs per route")
    parser.add_argument("--requests", type=int, default=20, help="small HTTP requests per route")
    parser.add_argument(
        "--edit-runs", type=int, default=3, help="edits per input and way (0: none)"
    )
    opts = parser.parse_args()
    figures = asyncio.run(main(opts.runs, opts.requests, opts.edit_runs))
    print(table(figures))
    print(
        f"\njob latency through anon: {figures['latency_ratio']:.2f}x direct; "
        f"throughput {figures['anyone']['throughput_mb_s']:.2f} MB/s vs "
        f"{figures['direct']['throughput_mb_s']:.2f} MB/s"
    )
    print(
        f"the job costs {figures['added_s']:+.2f} s through anon (target: at most +0.3 s); "
        f"a 20 MB result comes at {figures['big_share_of_circuit']:.0%} of the circuit's "
        f"own throughput (target: at least 50 %)"
    )
    for name, row in figures["edits"].items():
        print(
            f"edit with a {name}: the job takes {row['ratio']:.2f}x today's through anon "
            f"(target: at most 0.40x); {row['idle_core_ratio']:.2f}x with the scaling at its "
            f"CPU time; less the scaling {row['circuit_ratio']:.2f}x; "
            f"its bytes' floor {row['floor_ratio']:.2f}x"
        )
    print(json.dumps(figures))
