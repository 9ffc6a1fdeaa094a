"""What leaving no trace costs per job, in each mode, against the same job without.

    .venv/bin/python benchmarks/no_trace_cost.py [--jobs 40] [--size 512]

One edit job (the shipped `/qwen` workflow, one input image of SIZE x SIZE, one output)
runs again and again on the test suite's fake ComfyUI, which runs in a child process on
127.0.0.1 so that its CPU is not the client's. Runs rotate between three modes:

- **off** (`no_trace = false`): the input uploaded to `input/` under its content name,
  `SaveImage` writes the result to `output/`, the client downloads it with `GET /view`;
  nothing is removed;
- **temp** (the default): the input uploaded to `temp/` under a random name, the result
  written to `temp/` by a `PreviewImage` and downloaded with `GET /view`, then the input
  and the result overwritten with a 1x1 image and the history entry deleted;
- **memory** (`no_trace = "memory"`): the input as with temp, the result sent as a binary
  WebSocket frame by `SaveImageWebsocket`, then the input overwritten and the history
  entry deleted.

All strip the output's metadata. Each job gets its own seed, so the fake's cache never
answers for the sampler, and its own photo (a new user's photo, the usual case). The
figure is the median of each mode's wall time per job (upload to outputs in hand,
cleaning included), and its difference from off, also as a share of a job that takes
1 s on the GPU.

A second set of rows sends the same photo every time (a re-roll of an edit): with no trace
off ComfyUI's cache then skips the nodes that read the image (its key is the file name and
content); with a random name they run again. On the fake those nodes cost little; on a
GPU they include the edit model's image encoding.

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
from comfyveil.comfy import execute, uploads, workflow  # noqa: E402

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


MODES = ("off", "temp", "memory")
SETTING: dict[str, bool | str] = {"off": False, "temp": True, "memory": "memory"}


async def one_job(
    client: comfy_client.ComfyClient,
    wf: workflow.Workflow,
    data: bytes,
    seed: int,
    mode: str,
) -> float:
    image = uploads.InputImage(data, "image/jpeg")
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
    outcome = await execute.execute(client, wf, values, {"image": image}, no_trace=SETTING[mode])
    elapsed = time.perf_counter() - started
    assert len(outcome.files) == 1
    return elapsed


async def measure(url: str, jobs: int, size: int) -> dict[str, Any]:
    wf = workflow.find("qwen")
    times: dict[str, list[float]] = {f"{m}{r}": [] for m in MODES for r in ("", "_reroll")}
    photos = [photo(size, i) for i in range(jobs + 1)]
    async with comfy_client.ComfyClient(url, name="fake") as client:
        for warm in range(6):  # the socket, the node check, the fake's first PNG
            await one_job(client, wf, photos[-1], 10_000 + warm, MODES[warm % 3])
        for i in range(jobs):
            order = MODES[i % 3 :] + MODES[: i % 3]  # each mode first as often
            for reroll in ("", "_reroll"):
                for k, mode in enumerate(order):
                    seed = 8 * i + 4 * bool(reroll) + k
                    data = photos[0] if reroll else photos[i + 1]
                    times[f"{mode}{reroll}"].append(await one_job(client, wf, data, seed, mode))
    median = {k: statistics.median(v) * 1000 for k, v in times.items()}
    result: dict[str, Any] = {
        "benchmark": "no_trace_cost",
        "jobs_per_mode": jobs,
        "input_px": size,
        "target_pct": 5.0,
    }
    for mode in MODES:
        result[f"{mode}_ms"] = round(median[mode], 2)
        result[f"p90_{mode}_ms"] = round(_p90(times[mode]) * 1000, 2)
        result[f"reroll_{mode}_ms"] = round(median[f"{mode}_reroll"], 2)
    for mode in MODES[1:]:
        added = median[mode] - median["off"]
        result[f"{mode}_added_ms"] = round(added, 2)
        result[f"{mode}_share_of_1s_job_pct"] = round(added / 10, 2)
        result[f"{mode}_met"] = added / 10 < 5.0
        result[f"reroll_{mode}_added_ms"] = round(
            median[f"{mode}_reroll"] - median["off_reroll"], 2
        )
    return result


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


LABELS = {
    "off": "off (files, history kept)",
    "temp": "temp, the default (temp files, cleaned)",
    "memory": "memory (WS frames, cleaned)",
}


def print_table(result: dict[str, Any]) -> None:
    print(f"{'mode':<42}{'median':>10}{'p90':>10}{'vs off':>10}{'re-roll':>10}")
    print("-" * 82)
    for mode in MODES:
        added = result.get(f"{mode}_added_ms")
        vs_off = f"{added:+.2f}ms" if added is not None else "-"
        print(
            f"{LABELS[mode]:<42}{result[f'{mode}_ms']:>8.2f}ms{result[f'p90_{mode}_ms']:>8.2f}ms"
            f"{vs_off:>10}{result[f'reroll_{mode}_ms']:>8.2f}ms"
        )
    for mode in MODES[1:]:
        print(
            f"{mode}: {result[f'{mode}_added_ms']:+.2f} ms per job = "
            f"{result[f'{mode}_share_of_1s_job_pct']:+.2f} % of a 1 s job (target < "
            f"{result['target_pct']:.0f} %: {'met' if result[f'{mode}_met'] else 'missed'}); "
            f"re-roll {result[f'reroll_{mode}_added_ms']:+.2f} ms"
        )
    print(
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
