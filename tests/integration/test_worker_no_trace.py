"""Issue 12 through the worker: after a job, however it ends, the fake ComfyUI's history,
output, input and temp folders hold nothing of the user's; files carry no metadata."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import uuid

import pytest
from PIL import Image

from comfyveil import config, retention
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import notrace, pool, workflow
from comfyveil.store import database, jobs
from tests.fakes.comfyui import FakeComfyUI
from tests.integration.worker_support import (
    FAST,
    backend_configs,
    enqueue,
    running_worker,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.timeout(120)


def photo_with_gps() -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "PhoneMaker"
    exif[0x8825] = {1: "N", 2: (48.0, 51.0, 24.0), 3: "E", 4: (2.0, 21.0, 3.0)}
    out = io.BytesIO()
    Image.new("RGB", (96, 64), (20, 120, 200)).save(
        out, "JPEG", exif=exif.tobytes(), comment=b"my flat"
    )
    return out.getvalue()


async def enqueue_edit(db: database.Database, user: int = 5, steps: int = 1) -> jobs.Job:
    """An edit job whose stored input still has its EXIF (stored before this was stripped)."""
    await db.commands.seed()
    wf = workflow.find("qwen")
    values = wf.validate({"prompt": "add a hat", "steps": steps, "image": "photo.jpg"})
    values.pop("image")
    return await db.jobs.enqueue(
        jobs.NewJob(
            user_id=user,
            chat_id=user,
            command=wf.command,
            workflow_hash=wf.hash,
            params=values,
            inputs=[jobs.InputImage("photo.jpg", "image/jpeg", photo_with_gps())],
        )
    )


def user_files(fake: FakeComfyUI) -> dict[str, list[str]]:
    """Every file in the fake's folders that is not a 1x1 placeholder."""
    found: dict[str, list[str]] = {}
    for kind, folder in fake.dirs.items():
        for path in folder.rglob("*"):
            if path.is_file():
                with Image.open(path) as image:
                    if image.size == (1, 1):
                        continue
                found.setdefault(kind, []).append(path.name)
    return found


async def nothing_left(fake: FakeComfyUI) -> bool:
    return not fake.history_entries and not user_files(fake) and fake.running is None


async def test_an_edit_job_leaves_nothing_on_the_gpu_host_and_no_metadata_anywhere(
    db: database.Database, fake_comfy: FakeComfyUI
) -> None:
    job = await enqueue_edit(db)
    async with running_worker(db, [fake_comfy.url]):
        await wait_status(db, job.id, jobs.Status.SUCCEEDED)
    assert fake_comfy.executions[str(job.id)] == 1
    assert fake_comfy.history_entries == {} and user_files(fake_comfy) == {}
    (sent,) = [u for u in fake_comfy.uploads if not u["overwrite"]]
    assert sent["type"] == "temp"
    assert b"PhoneMaker" not in sent["data"] and b"my flat" not in sent["data"]
    with Image.open(io.BytesIO(sent["data"])) as uploaded:
        assert not uploaded.getexif()  # no camera, no GPS
    (prompt,) = fake_comfy.prompts
    (saver,) = [n for n in prompt["prompt"].values() if n["class_type"] == "PreviewImage"]
    assert set(saver["inputs"]) == {"images", notrace.RUN_INPUT}  # no cache answers for it
    assert "SaveImage" not in {n["class_type"] for n in prompt["prompt"].values()}
    (output,) = await db.jobs.outputs(job.id)
    assert output.filename.endswith("_00001_.png") and "temp" not in output.filename
    with Image.open(io.BytesIO(output.data)) as image:
        assert image.format == "PNG" and set(image.info) <= {"dpi", "icc_profile"}
    assert await db.traces.settled() == []


async def test_legacy_frames_without_metadata_are_attributed_too(
    db: database.Database, fake_comfy: FakeComfyUI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client that did not negotiate preview metadata gets type-1 frames naming no node.
    monkeypatch.setattr(fake_comfy, "socket_flags", _Forgetful())
    job = await enqueue(db, steps=1, width=256, height=256)
    # Frames are what this test is about: an operator's choice, `no_trace = "memory"`.
    async with running_worker(db, [fake_comfy.url], no_trace="memory"):
        await wait_status(db, job.id, jobs.Status.SUCCEEDED)
    (output,) = await db.jobs.outputs(job.id)
    with Image.open(io.BytesIO(output.data)) as image:
        assert image.size == (256, 256)
    assert await nothing_left(fake_comfy)


class _Forgetful(dict):  # type: ignore[type-arg]
    def __setitem__(self, key: object, value: object) -> None:
        pass  # the flags a client sends are never recorded


async def test_a_failed_job_leaves_nothing_behind(
    db: database.Database, fake_comfy: FakeComfyUI
) -> None:
    fake_comfy.fail_next_execution("KSampler")
    job = await enqueue_edit(db)
    async with running_worker(db, [fake_comfy.url]):
        await wait_status(db, job.id, jobs.Status.FAILED)
    assert fake_comfy.executions[str(job.id)] == 1
    assert await nothing_left(fake_comfy)
    assert await db.traces.settled() == []


async def test_a_job_cancelled_while_it_runs_leaves_nothing_behind(
    db: database.Database, fake_comfy_factory
) -> None:
    fake = await fake_comfy_factory(step_delay=0.3)
    job = await enqueue_edit(db, steps=20)
    async with running_worker(db, [fake.url]):
        await wait_for(lambda: _true(fake.running is not None), timeout=20)
        await db.jobs.cancel(job.id)
        await wait_status(db, job.id, jobs.Status.CANCELLED)
        await wait_for(lambda: nothing_left(fake), timeout=15)
        await wait_for(lambda: _no_traces(db), timeout=5)


async def test_a_job_handed_back_mid_run_is_re_attached_and_its_images_still_come(
    db: database.Database, fake_comfy_factory
) -> None:
    """The images of a re-attached prompt go to the socket id it was posted with; the
    successor takes that id over, so the GPU work is still paid once."""
    fake = await fake_comfy_factory(step_delay=0.3)
    job = await enqueue_edit(db, steps=10)
    quick_stop = dataclasses.replace(FAST, shutdown_grace=0.1)
    async with running_worker(db, [fake.url], options=quick_stop):
        await wait_for(lambda: _true(fake.running is not None), timeout=20)
    handed_back = await db.jobs.get(job.id)
    assert handed_back is not None and handed_back.submitted
    assert fake.running is not None  # still on the GPU
    async with running_worker(db, [fake.url]):
        await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
    assert fake.executions[str(job.id)] == 1
    assert len(await db.jobs.outputs(job.id)) == 1
    assert await nothing_left(fake)
    assert await db.traces.settled() == []


async def test_a_prompt_that_ended_with_no_worker_is_fetched_not_run_again(
    db: database.Database, fake_comfy_factory
) -> None:
    """The default: the images wait in the temp folder for the successor."""
    fake = await fake_comfy_factory(step_delay=0.2)
    job = await enqueue_edit(db, steps=5)
    quick_stop = dataclasses.replace(FAST, shutdown_grace=0.1)
    async with running_worker(db, [fake.url], options=quick_stop):
        await wait_for(lambda: _true(fake.running is not None), timeout=20)
    await wait_for(lambda: _true(str(job.id) in fake.history_entries), timeout=20)
    assert user_files(fake).get("temp")  # its image waits there for a successor
    async with running_worker(db, [fake.url]):
        await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
    assert fake.executions[str(job.id)] == 1
    (output,) = await db.jobs.outputs(job.id)
    assert output.data.startswith(b"\x89PNG")
    assert await nothing_left(fake)
    assert await db.traces.settled() == []


async def test_with_memory_images_sent_to_a_dead_socket_are_made_again_and_nothing_stays(
    db: database.Database, fake_comfy_factory
) -> None:
    # The cost of the operator's choice `no_trace = "memory"` (docs/privacy/no-trace.md).
    fake = await fake_comfy_factory(step_delay=0.2)
    job = await enqueue_edit(db, steps=5)
    quick_stop = dataclasses.replace(FAST, shutdown_grace=0.1)
    async with running_worker(db, [fake.url], options=quick_stop, no_trace="memory"):
        await wait_for(lambda: _true(fake.running is not None), timeout=20)
    await wait_for(lambda: _true(str(job.id) in fake.history_entries), timeout=20)
    async with running_worker(db, [fake.url], no_trace="memory"):
        await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
    assert fake.executions[str(job.id)] == 2  # the first run's images were lost with it
    assert await nothing_left(fake)
    assert await db.traces.settled() == []


async def test_the_retention_sweep_removes_what_a_crash_left_on_a_backend(
    db: database.Database, fake_comfy: FakeComfyUI
) -> None:
    # What a worker that died after posting left there: an input, an output file and the
    # history entry, all written down in backend_traces, the job itself gone (forgotten).
    job_id = uuid.uuid4()
    wf = workflow.find("qwen")
    upload = notrace.upload_trace("image/jpeg")
    async with comfy_client.ComfyClient(fake_comfy.url, name="gpu0") as client:
        await db.traces.record(job_id, "gpu0", [notrace.Trace("history", str(job_id)), upload])
        await client.upload_image(photo_with_gps(), upload.name, type="temp")
        values = wf.validate({"prompt": "hat", "steps": 1, "image": upload.reference})
        result = await client.run(wf.apply(values), prompt_id=str(job_id))
    assert result.outputs and user_files(fake_comfy)  # SaveImage wrote its file
    privacy = config.PrivacyConfig()
    async with pool.Pool(backend_configs([fake_comfy.url]), probe_interval=0.2) as backends:
        assert await retention.purge_once(db, privacy, backends) == 0
    assert await nothing_left(fake_comfy)
    assert await db.traces.settled() == []


async def _no_traces(db: database.Database) -> bool:
    return await db.traces.settled() == []


async def _true(value: bool) -> bool:
    return value


async def test_a_video_is_written_there_downloaded_then_overwritten(
    db: database.Database, fake_comfy: FakeComfyUI
) -> None:
    # SaveVideo has no in-memory equivalent: its file is the one thing written to disk.
    job = await enqueue(db, command="wan", steps=3, width=256, height=256, length=5)
    async with running_worker(db, [fake_comfy.url]):
        await wait_status(db, job.id, jobs.Status.SUCCEEDED)
    (output,) = await db.jobs.outputs(job.id)
    assert output.kind == "video" and output.data[4:8] == b"ftyp"
    (written,) = fake_comfy.dirs["output"].rglob("*.mp4")
    with Image.open(written) as placeholder:  # the video's name, a 1x1 image inside
        assert placeholder.size == (1, 1)
    assert await nothing_left(fake_comfy)
    assert await db.traces.settled() == []


async def test_what_a_job_left_on_a_backend_is_swept_soon_after_it_ends_not_at_the_next_purge(
    db: database.Database, fake_comfy: FakeComfyUI
) -> None:
    # A job whose first try failed there after its prompt ran (its images wait in temp/,
    # written down in backend_traces) and whose retry then ended on another backend:
    # nothing of it is running anywhere any more, and nothing else would clean gpu0.
    job_id = uuid.uuid4()
    wf = workflow.find("qwen")
    upload = notrace.upload_trace("image/jpeg")
    privacy = config.PrivacyConfig()
    async with pool.Pool(backend_configs([fake_comfy.url]), probe_interval=0.2) as backends:
        sweeping = asyncio.create_task(
            retention.purge_forever(db, privacy, backends=backends, sweep_interval=0.2)
        )
        try:
            await asyncio.sleep(0.3)  # the purge at start is done: this comes after it
            async with comfy_client.ComfyClient(fake_comfy.url, name="gpu0") as client:
                await client.upload_image(photo_with_gps(), upload.name, type="temp")
                values = wf.validate({"prompt": "hat", "steps": 1, "image": upload.reference})
                await client.run(wf.apply(values), prompt_id=str(job_id))
            # Written down once the files are there: no job row says this one is running,
            # so a sweep between the record and the run would find nothing yet and close
            # the traces (a loaded machine hit that window once).
            await db.traces.record(job_id, "gpu0", [notrace.Trace("history", str(job_id)), upload])
            assert user_files(fake_comfy)
            await wait_for(lambda: nothing_left(fake_comfy), timeout=10)
            await wait_for(lambda: _no_traces(db), timeout=10)
        finally:
            sweeping.cancel()


async def test_an_output_whose_overwrite_failed_is_still_found_by_the_next_sweep(
    db: database.Database, fake_comfy: FakeComfyUI
) -> None:
    # The clean-up after a job: one overwrite answered 500. The prompt's history entry,
    # the only record of its output files' names, must outlive that failure.
    job_id = uuid.uuid4()
    wf = workflow.find("qwen")
    upload = notrace.upload_trace("image/jpeg")
    history = notrace.Trace("history", str(job_id))
    async with comfy_client.ComfyClient(fake_comfy.url, name="gpu0") as client:
        await db.traces.record(job_id, "gpu0", [history, upload])
        await client.upload_image(photo_with_gps(), upload.name, type="temp")
        values = wf.validate({"prompt": "hat", "steps": 1, "image": upload.reference})
        await client.run(wf.apply(values), prompt_id=str(job_id))
        await db.traces.drop("gpu0", await notrace.scrub(client, None, [upload]))
        fake_comfy.fail_requests("/upload/image", times=1)
        gone = await notrace.scrub(client, str(job_id), [])  # the outputs its history names
        await db.traces.drop("gpu0", gone)
    assert user_files(fake_comfy)  # one file could not be overwritten
    async with pool.Pool(backend_configs([fake_comfy.url]), probe_interval=0.2) as backends:
        await retention.purge_once(db, config.PrivacyConfig(), backends)
    assert await nothing_left(fake_comfy)
    assert await db.traces.settled() == []
