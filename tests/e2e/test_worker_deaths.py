"""Paying once and leaving no trace at the same time, with the defaults (issue 21).

A `comfyveil worker` process is SIGKILLed at each moment of a job, and another worker (or
the same one restarted under its --id) finishes it. Each test counts the prompts the fake
ComfyUI was posted and ran for the job (one each), the deliveries (one), and what is left
on the GPU host afterwards (nothing: no history entry, no file of the user's in input/,
output/ or temp/).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from comfyveil import config, retention, sinks
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import pool
from comfyveil.store import database, jobs
from tests import zygote
from tests.e2e.test_worker_cli import cli, run_cli, write_config
from tests.fakes.comfyui import FakeComfyUI
from tests.integration.test_worker_no_trace import nothing_left
from tests.integration.worker_support import (
    backend_configs,
    enqueue,
    never,
    running_worker,
    wait_for,
    wait_status,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

DOOMED_LEASE = 2.0  # seconds: the killed worker's lease, which a stranger waits out


async def _start_doomed(
    tmp_path: Path, database_url: str, fake: FakeComfyUI, *, lease: float = DOOMED_LEASE
) -> tuple[zygote.Process, Path]:
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, [fake.url], lease=lease)
    proc = await cli(
        "worker",
        "--config",
        str(cfg),
        "--id",
        "doomed",
        "--out",
        str(tmp_path / "first"),
        cwd=tmp_path,
    )
    return proc, cfg


async def _kill(proc: zygote.Process) -> float:
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    return time.monotonic()


def _posted(fake: FakeComfyUI, job: jobs.Job) -> int:
    return sum(1 for p in fake.prompts if p["prompt_id"] == str(job.id))


async def _finished_once_by_a_stranger(
    db: database.Database, fake: FakeComfyUI, job: jobs.Job, tmp_path: Path
) -> jobs.Job:
    """Another worker finishes the job: submitted and run once, delivered once (by it,
    not by the dead one), nothing left on the GPU host."""
    sink = sinks.FileSink(tmp_path / "second")
    async with running_worker(db, [fake.url], delivery=[sink]):
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
        await wait_for(lambda: _true(len(sink.delivered) == 1), timeout=10)
        await wait_for(lambda: nothing_left(fake), timeout=10)
        await never(lambda: _true(len(sink.delivered) > 1), within=1.0)
    assert _posted(fake, job) == 1 and fake.executions[str(job.id)] == 1
    assert sink.delivered[0].read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "first").exists()  # the dead worker delivered nothing
    assert await db.traces.settled() == []
    return done


async def _submitted(db: database.Database, job: jobs.Job) -> bool:
    current = await db.jobs.get(job.id)
    return bool(current and current.submitted)


async def test_killed_before_the_prompt_was_posted(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory(step_delay=0.05)
    fake.hold("/prompt", method="POST")  # the worker stops just before its POST arrives
    proc, _ = await _start_doomed(tmp_path, database_url, fake)
    try:
        job = await enqueue(db, steps=4)
        await wait_for(lambda: _true(fake.held["POST /prompt"] >= 1), timeout=30)
    finally:
        await _kill(proc)
    fake.release("/prompt", method="POST")
    assert await _submitted(db, job) and _posted(fake, job) == 0
    await _finished_once_by_a_stranger(db, fake, job, tmp_path)


async def test_killed_while_its_prompt_waits_in_comfyuis_queue(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory(step_delay=0.05)
    fake.pause()  # the GPU takes nothing from its queue
    proc, _ = await _start_doomed(tmp_path, database_url, fake)
    try:
        job = await enqueue(db, steps=4)
        await wait_for(
            lambda: _true(any(p.prompt_id == str(job.id) for p in fake.pending)), timeout=30
        )
    finally:
        await _kill(proc)

    async def resume_once_taken_over() -> None:
        async def taken() -> bool:
            current = await db.jobs.get(job.id)
            return current is not None and current.lease_owner not in (None, "doomed")

        await wait_for(taken, timeout=20)
        fake.resume()

    resuming = asyncio.create_task(resume_once_taken_over())
    await _finished_once_by_a_stranger(db, fake, job, tmp_path)
    await resuming


async def test_killed_while_its_prompt_runs_is_taken_over_within_the_lease(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory(step_delay=0.4)  # 3.2 s on the GPU
    proc, _ = await _start_doomed(tmp_path, database_url, fake)
    try:
        job = await enqueue(db, steps=8)
        await wait_for(
            lambda: _true(fake.running is not None and fake.running.prompt_id == str(job.id)),
            timeout=30,
        )
    finally:
        killed_at = await _kill(proc)
    taken_after: list[float] = []

    async def watch() -> None:
        async def taken() -> bool:
            current = await db.jobs.get(job.id)
            return current is not None and current.lease_owner not in (None, "doomed")

        await wait_for(taken, timeout=20, interval=0.02)
        taken_after.append(time.monotonic() - killed_at)

    watching = asyncio.create_task(watch())
    done = await _finished_once_by_a_stranger(db, fake, job, tmp_path)
    await watching
    # Its lease, plus the stranger's look for expired leases (0.3 s), plus slack for a
    # busy machine.
    assert taken_after[0] < DOOMED_LEASE + 1.5, taken_after
    assert done.attempts == 2


async def test_killed_after_its_prompt_ended_before_the_images_came_home(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory(step_delay=0.05)
    fake.hold("/view")  # the prompt has ended; its image waits in temp/
    proc, _ = await _start_doomed(tmp_path, database_url, fake)
    try:
        job = await enqueue(db, steps=4)
        await wait_for(lambda: _true(fake.held["GET /view"] >= 1), timeout=30)
    finally:
        await _kill(proc)
    fake.release("/view")
    assert str(job.id) in fake.history_entries and fake.running is None
    assert list(fake.dirs["temp"].glob("ComfyUI_temp_*.png"))  # the image, not yet home
    await _finished_once_by_a_stranger(db, fake, job, tmp_path)


async def test_killed_after_the_result_was_stored_before_the_gpu_host_was_cleaned(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory(step_delay=0.05)
    fake.hold("/upload/image", method="POST")  # the overwrite of its image, once stored
    proc, _ = await _start_doomed(tmp_path, database_url, fake)
    try:
        job = await enqueue(db, steps=4)
        await wait_for(lambda: _true(fake.held["POST /upload/image"] >= 1), timeout=30)
        await wait_for(lambda: _true(len(list((tmp_path / "first").glob("*.png"))) == 1), 10)
    finally:
        await _kill(proc)
    fake.release("/upload/image", method="POST")
    done = await db.jobs.get(job.id)
    assert done is not None and done.status is jobs.Status.SUCCEEDED
    assert str(job.id) in fake.history_entries  # left behind, and written down
    # The hourly retention purge of any worker or bot sweeps what the dead one left.
    async with pool.Pool(backend_configs([fake.url]), probe_interval=0.2) as backends:
        await retention.purge_once(db, config.PrivacyConfig(), backends)
    assert await nothing_left(fake) and await db.traces.settled() == []
    assert _posted(fake, job) == 1 and fake.executions[str(job.id)] == 1
    assert len(list((tmp_path / "first").iterdir())) == 1  # delivered once, by the dead one


async def test_a_worker_restarted_under_its_id_takes_its_job_back_at_once(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory(step_delay=0.4)
    lease = 60.0  # far longer than the test may wait: the restart must not wait it out
    proc, cfg = await _start_doomed(tmp_path, database_url, fake, lease=lease)
    try:
        job = await enqueue(db, steps=8)
        await wait_for(
            lambda: _true(fake.running is not None and fake.running.prompt_id == str(job.id)),
            timeout=30,
        )
    finally:
        await _kill(proc)
    out = tmp_path / "again"
    again = await cli(
        "worker", "--config", str(cfg), "--id", "doomed", "--out", str(out), cwd=tmp_path
    )
    try:
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=20)
        await wait_for(lambda: _true(out.exists() and len(list(out.iterdir())) == 1), 10)
        await wait_for(lambda: nothing_left(fake), timeout=10)
    finally:
        again.send_signal(signal.SIGTERM)
        await asyncio.wait_for(again.wait(), 30)
    assert _posted(fake, job) == 1 and fake.executions[str(job.id)] == 1
    assert done.attempts == 2 and len(list(out.iterdir())) == 1
    assert not (tmp_path / "first").exists()
    assert await db.traces.settled() == []


@pytest.mark.real_comfyui
async def test_on_a_real_comfyui_a_killed_worker_leaves_nothing_and_pays_once(
    db: database.Database, database_url: str, tmp_path: Path
) -> None:
    """COMFYUI_URL=http://127.0.0.1:8188 [COMFYUI_DIR=/srv/ComfyUI] pytest -m real_comfyui
    tests/e2e/test_worker_deaths.py: a model-free job slow enough on a CPU (blurs of a
    1024 px image) is killed mid-run; a second worker finishes it. COMFYUI_DIR, when set,
    lets the test list the server's input/, output/ and temp/ folders (with the default
    temp folder; a server started with --temp-directory keeps it elsewhere)."""
    url = os.environ.get("COMFYUI_URL")
    if not url:
        pytest.skip("COMFYUI_URL is not set")
    host = urllib.parse.urlsplit(url).hostname or ""
    if not ipaddress.ip_address(host).is_loopback:
        pytest.skip("tests send traffic only to 127.0.0.1: put a proxy there")
    folders = _real_folders()
    before = {name: set(_listing(path)) for name, path in folders.items()}
    flows = _slow_model_free_workflow(tmp_path / "flows")
    photo = tmp_path / "photo.png"
    Image.new("RGB", (1024, 1024), (30, 140, 90)).save(photo)
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, [url], lease=DOOMED_LEASE)
    code, stdout, stderr = await run_cli(
        "submit", str(flows), "--image", str(photo), "--config", str(cfg), cwd=tmp_path
    )
    assert code == 0, stderr
    job_id = stdout.strip()
    proc = await cli("worker", "--config", str(cfg), "--id", "doomed", cwd=tmp_path)
    try:

        async def running_there() -> bool:
            current = await db.jobs.get(uuid.UUID(job_id))
            return bool(current and current.submitted)

        await wait_for(running_there, timeout=60)
        await asyncio.sleep(1.0)  # well into the first blur
    finally:
        await _kill(proc)
    async with running_worker(db, [url]):
        done = await wait_status(db, uuid.UUID(job_id), jobs.Status.SUCCEEDED, timeout=120)
    assert done.attempts == 2
    (output,) = await db.jobs.outputs(uuid.UUID(job_id))
    assert output.data.startswith(b"\x89PNG")
    async with comfy_client.ComfyClient(url, name="real") as client:
        everything = await client._call("GET", "/history")
        assert job_id not in everything
        ran = [e for e in await db.jobs.events(uuid.UUID(job_id)) if e.kind == "submitted"]
        assert len(ran) == 1
    for name, path in folders.items():
        new = set(_listing(path)) - before[name]
        left = [f for f in new if not _placeholder(path / f)]
        assert left == [], (name, left)


def _real_folders() -> dict[str, Path]:
    base = os.environ.get("COMFYUI_DIR")
    if not base:
        return {}
    return {name: Path(base) / name for name in ("input", "output", "temp")}


def _listing(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]


def _placeholder(path: Path) -> bool:
    try:
        with Image.open(path) as image:
            return image.size == (1, 1)
    except OSError:
        return False


def _slow_model_free_workflow(folder: Path) -> Path:
    """LoadImage -> three ImageBlur(31) -> SaveImage: a few seconds on a CPU."""
    folder.mkdir(parents=True, exist_ok=True)
    graph: dict[str, Any] = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "example.png"}},
        "2": {
            "class_type": "ImageBlur",
            "inputs": {"image": ["1", 0], "blur_radius": 31, "sigma": 10.0},
        },
        "3": {
            "class_type": "ImageBlur",
            "inputs": {"image": ["2", 0], "blur_radius": 31, "sigma": 10.0},
        },
        "4": {
            "class_type": "ImageBlur",
            "inputs": {"image": ["3", 0], "blur_radius": 31, "sigma": 10.0},
        },
        "5": {
            "class_type": "SaveImage",
            "inputs": {"images": ["4", 0], "filename_prefix": "comfyveil/slow"},
        },
    }
    (folder / "slow.json").write_text(json.dumps(graph))
    (folder / "slow.toml").write_text(
        'command = "slowblur"\ntitle = "Slow blur"\ndescription = "Blur an image, slowly"\n'
        'kind = "image"\n\n[params.image]\nnode = "1"\ninput = "image"\ntype = "image"\n'
        'required = true\ndescription = "the image to blur"\n'
    )
    return folder / "slow.toml"


async def _true(value: bool) -> bool:
    return value
