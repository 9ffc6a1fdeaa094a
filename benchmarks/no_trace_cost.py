"""What leaving no trace costs per job: steps 2-4 of issue 12 against the same job without.

    .venv/bin/python benchmarks/no_trace_cost.py [--jobs 40] [--size 512]

One edit job (the shipped `/qwen` workflow, one input image of SIZE x SIZE, one output)
runs again and again on the test suite's fake ComfyUI, which runs in a child process on
127.0.0.1 so that its CPU is not the client's. Runs alternate between:

- **without**: the input uploaded to `input/` under its content name, `SaveImage` writes
  the result to `output/`, the client downloads it with `GET /view`; nothing is removed;
- **no trace**: the input uploaded to `temp/` under a random name, the result sent as a
  binary WebSocket frame by `SaveImageWebsocket`, then the input overwritten with a 1x1
  image and the history entry deleted.

Both strip the output's metadata (step 1 of the issue, not measured here). Each job gets
its own seed, so the fake's cache never answers for the sampler, and its own photo (a new
user's photo, the usual case). The figure is the median of each mode's wall time per job
(upload to outputs in hand, cleaning included), and their difference as a share of a job
that takes 1 s on the GPU.

A second pair of rows sends the same photo every time (a re-roll of an edit): without no
trace ComfyUI's cache then skips the nodes that read the image (its key is the file name
and content); with it the random name makes them run again. On the fake those nodes cost
little; on a GPU they include the edit model's image encoding.

Prints a table, then one JSON object as the last line. The worker also writes the job's
traces down in PostgreSQL and strikes them out (two statements per job), not counted here.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from PIL import Image  # noqa: E402

from comfyveil.comfy import client as comfy_client  # noqa: E402
from comfyveil.comfy import execute, workflow  # noqa: E402

SERVER = r"""
import asyncio, sys
from tests.fakes.comfyui import FakeComfyUI

async def main():
    async with FakeComfyUI() as fake:
        print(fake.url, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


def start_fake() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"},
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise SystemExit("the fake ComfyUI did not start")
    return proc, url


def photo(size: int, variant: int = 0) -> bytes:
    image = Image.new("RGB", (size, size))
    image.putdata(
        [
            ((x + variant) % 256, y % 256, (x * y + 7 * variant) % 256)
            for y in range(size)
            for x in range(size)
        ]
    )
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


async def one_job(
    client: comfy_client.ComfyClient,
    wf: workflow.Workflow,
    data: bytes,
    seed: int,
    no_trace: bool,
) -> float:
    image = execute.InputImage(data, "image/jpeg")
    values = wf.validate(
        {
            "prompt": "add a hat",
            "steps": 1,
            "seed": seed,
            "image": image.upload_name,
            "megapixels": 0.25,
        }
    )
    started = time.perf_counter()
    outcome = await execute.execute(client, wf, values, {"image": image}, no_trace=no_trace)
    elapsed = time.perf_counter() - started
    assert len(outcome.files) == 1
    return elapsed


async def measure(url: str, jobs: int, size: int) -> dict[str, Any]:
    wf = workflow.find("qwen")
    modes = ("without", "no_trace")
    times: dict[str, list[float]] = {f"{m}{r}": [] for m in modes for r in ("", "_reroll")}
    photos = [photo(size, i) for i in range(jobs + 1)]
    async with comfy_client.ComfyClient(url, name="fake") as client:
        for warm in range(3):  # the socket, the node check, the fake's first PNG
            await one_job(client, wf, photos[-1], 10_000 + warm, no_trace=warm % 2 == 0)
        for i in range(jobs):
            order = modes if i % 2 else modes[::-1]
            for reroll in ("", "_reroll"):
                for mode in order:
                    seed = 4 * i + 2 * bool(reroll) + (mode == "no_trace")
                    data = photos[0] if reroll else photos[i + 1]
                    elapsed = await one_job(client, wf, data, seed, mode == "no_trace")
                    times[f"{mode}{reroll}"].append(elapsed)
    median = {k: statistics.median(v) * 1000 for k, v in times.items()}
    added = median["no_trace"] - median["without"]
    return {
        "benchmark": "no_trace_cost",
        "jobs_per_mode": jobs,
        "input_px": size,
        "without_ms": round(median["without"], 2),
        "no_trace_ms": round(median["no_trace"], 2),
        "added_ms": round(added, 2),
        "share_of_1s_job_pct": round(added / 10, 2),
        "target_pct": 5.0,
        "met": added / 10 < 5.0,
        "p90_without_ms": round(_p90(times["without"]) * 1000, 2),
        "p90_no_trace_ms": round(_p90(times["no_trace"]) * 1000, 2),
        "reroll_without_ms": round(median["without_reroll"], 2),
        "reroll_no_trace_ms": round(median["no_trace_reroll"], 2),
        "reroll_added_ms": round(median["no_trace_reroll"] - median["without_reroll"], 2),
    }


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def print_table(result: dict[str, Any]) -> None:
    print(f"{'mode':<40}{'median':>10}{'p90':>10}")
    print("-" * 60)
    print(
        f"{'new photo, without (files, history kept)':<40}{result['without_ms']:>8.2f}ms"
        f"{result['p90_without_ms']:>8.2f}ms"
    )
    print(
        f"{'new photo, no trace (WS frames, cleaned)':<40}{result['no_trace_ms']:>8.2f}ms"
        f"{result['p90_no_trace_ms']:>8.2f}ms"
    )
    print(f"{'same photo again (re-roll), without':<40}{result['reroll_without_ms']:>8.2f}ms")
    print(f"{'same photo again (re-roll), no trace':<40}{result['reroll_no_trace_ms']:>8.2f}ms")
    print(
        f"added per job: {result['added_ms']:+.2f} ms = {result['share_of_1s_job_pct']:+.2f} % "
        f"of a 1 s job (target < {result['target_pct']:.0f} %: "
        f"{'met' if result['met'] else 'missed'}); re-roll {result['reroll_added_ms']:+.2f} ms; "
        f"{result['jobs_per_mode']} jobs per mode, {result['input_px']}x{result['input_px']} "
        "input, fake ComfyUI on 127.0.0.1"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=40, help="jobs per mode")
    parser.add_argument("--size", type=int, default=512, help="input image width and height")
    args = parser.parse_args()
    server, base = start_fake()
    try:
        outcome = asyncio.run(measure(base, args.jobs, args.size))
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)
    print_table(outcome)
    print(json.dumps(outcome))
