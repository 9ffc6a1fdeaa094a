"""A tampering ComfyUI against `comfyveil generate --timeout N`, at the default caps.

The five cases of issue 11 §1, each in its own `comfyveil generate` process under a
small wrapper that reports the process's peak RSS (RUSAGE_CHILDREN of the wrapper,
whose only child it is) and kills it past a memory guard, so an old build that grows
without end cannot take this machine down with it:

- an endless /view body, a /view that trickles one byte every 10 s,
- a 300 MB WebSocket text frame, a history listing 20 000 outputs,
- an upload the server stops reading.

Target: every case ends within the deadline + 10 s, peak RSS under 400 MB. The tests
(tests/e2e/test_generate_hostile.py) check the same with a 3 s deadline and a 64 MiB
cap; this runs the issue's setting (--timeout 30, max_output_bytes 512 MiB).

    .venv/bin/python benchmarks/hostile_backend.py [--timeout 30] [--src OTHER/src]

`--src` runs another checkout's code (e.g. the commit before the fix) for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image
from tests.fakes.tampering import TamperingComfyUI

SLACK = 10.0
PEAK_RSS_MB = 400.0
GUARD_MB = 3000  # the wrapper kills the process past this

CASES: dict[str, dict[str, Any]] = {
    "endless /view body": {"endless_view": True},
    "/view trickling 1 byte/10 s": {"trickle_view": True, "trickle_interval": 10},
    "300 MB WebSocket text frame": {"huge_ws_text": 300 * 1024 * 1024},
    "history with 20 000 outputs": {"listed_outputs": 20_000},
    "stalled upload": {"stall_upload": True},
}

WRAPPER = """
import json, resource, subprocess, sys, time
guard_kib, limit = int(sys.argv[1]) * 1024, float(sys.argv[2])
started = time.monotonic()
proc = subprocess.Popen(sys.argv[3:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
killed = None
while proc.poll() is None:
    try:
        with open(f"/proc/{proc.pid}/status") as status:
            rss = next(int(l.split()[1]) for l in status if l.startswith("VmRSS:"))
    except (OSError, StopIteration):
        rss = 0
    if rss > guard_kib:
        killed = "memory guard"
    elif time.monotonic() - started > limit:
        killed = "still running"
    if killed:
        proc.kill()
        break
    time.sleep(0.02)
out, err = proc.communicate()
print(json.dumps({
    "code": proc.returncode, "took": time.monotonic() - started, "killed": killed,
    "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    "last_line": (err.decode(errors="replace").strip().splitlines() or [""])[-1],
}))
"""


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "red").save(buffer, "PNG")
    return buffer.getvalue()


async def one(case: str, timeout: float, src: Path, work: Path) -> dict[str, Any]:
    folder = work / case.replace(" ", "_").replace("/", "")
    folder.mkdir()
    fake = TamperingComfyUI(root=folder / "comfyui", **CASES[case])
    await fake.start()
    try:
        # Files to download (the tampered /view), not images over the WebSocket.
        (folder / "comfyveil.toml").write_text(
            f'[[backends]]\nname = "gpu0"\nurl = "{fake.url}"\nno_trace = false\n'
        )
        if case == "stalled upload":
            (folder / "photo.png").write_bytes(png(64, 64))
            run = ["qwen", "a hat", "--image", "photo.png"]
        else:
            run = ["f", "a fox", "--set", "width=256", "--set", "height=256"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYVEIL_")}
        env["COMFYVEIL_DATA_DIR"] = str(folder / "data")
        env["PYTHONPATH"] = str(src)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRAPPER, str(GUARD_MB), str(timeout + 60),
            sys.executable, "-m", "comfyveil", "generate", *run, "--set", "steps=1",
            "--server", fake.url, "--timeout", str(timeout), "--config", "comfyveil.toml",
            "--out", "out", cwd=folder, env=env, stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
    finally:
        await fake.stop()
    return json.loads(out)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent / "src")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        for case in CASES:
            results[case] = await one(case, args.timeout, args.src.resolve(), Path(tmp))
    print(f"comfyveil generate --timeout {args.timeout:g} against a tampering ComfyUI")
    print(f"{'case':30} {'ends after':>11} {'peak RSS':>9}  result")
    met = True
    for case, r in results.items():
        ok = r["killed"] is None and r["took"] <= args.timeout + SLACK
        ok = ok and r["peak_mb"] < PEAK_RSS_MB
        met &= ok
        end = f"killed ({r['killed']})" if r["killed"] else f"exit {r['code']}: {r['last_line']}"
        print(f"{case:30} {r['took']:>9.1f} s {r['peak_mb']:>6.0f} MB  {end}")
    print(f"target: each ends within {args.timeout + SLACK:g} s, peak RSS < {PEAK_RSS_MB:g} MB: "
          + ("met" if met else "NOT met"))
    print(json.dumps({"timeout": args.timeout, "met": met, "cases": results}))


if __name__ == "__main__":
    asyncio.run(main())
