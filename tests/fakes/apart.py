"""Fake ComfyUI servers in a process of their own, for the benchmarks that time them.

A real GPU's run does not stretch when the bot's event loop is busy; a fake's in the
measuring process does (its steps are sleeps on that loop). `eta_accuracy` measured it:
at `--scale 0.25`, runs on in-process fakes took 0.75x-1.23x of their prediction
(10th-90th percentile), and that noise moved the ETAs it judged.

    async with fakes_apart([{"step_cost": 0.05, "root": "/tmp/x"}, ...]) as urls:
        ...

Run as `python -m tests.fakes.apart SPECS`, it is the child: it starts one
`FakeComfyUI(**spec)` per spec, prints their URLs as one JSON line, and serves until its
stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


@contextlib.asynccontextmanager
async def fakes_apart(specs: Sequence[dict[str, Any]]) -> AsyncIterator[list[str]]:
    """The URLs of one fake ComfyUI per spec (FakeComfyUI's keyword arguments, as JSON:
    `root` a path string), served by a child process until the block ends."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.apart",
        json.dumps(list(specs)),
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"},
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
        urls = json.loads(line) if line else None
        if not (
            isinstance(urls, list)
            and len(urls) == len(specs)
            and all(isinstance(u, str) and u.startswith("http://127.0.0.1:") for u in urls)
        ):
            raise SystemExit("the fake ComfyUI servers did not start")
        yield urls
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _serve(specs: list[dict[str, Any]]) -> None:
    from tests.fakes.comfyui import FakeComfyUI

    fakes = [
        FakeComfyUI(**{**spec, **({"root": Path(spec["root"])} if "root" in spec else {})})
        for spec in specs
    ]
    for fake in fakes:
        await fake.start()
    try:
        print(json.dumps([fake.url for fake in fakes]), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        for fake in fakes:
            await fake.stop()


if __name__ == "__main__":
    asyncio.run(_serve(json.loads(sys.argv[1])))
