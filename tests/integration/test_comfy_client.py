"""ComfyClient against the protocol-faithful fake ComfyUI (and a real one when asked)."""

from __future__ import annotations

import asyncio
import io
import os
import socket
from typing import Any

import av
import pytest
from PIL import Image

from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import errors, events, results
from tests.fakes.comfyui import FakeComfyUI
from tests.fixtures.comfy import FakeFactory
from tests.lazy import lazy_import

np = lazy_import("numpy")  # loaded by the first test that uses it


def empty_image(width: int = 64, height: int = 48, prefix: str = "probe") -> dict[str, Any]:
    return {
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": width, "height": height, "batch_size": 1, "color": 0x123456}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    }


def invert(image: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage",
              "inputs": {"images": ["2", 0], "filename_prefix": "inv/x"}},
    }


def mini_model(steps: int = 4, unet: str = "flux1-schnell.safetensors") -> dict[str, Any]:
    """UNETLoader -> KSampler -> VAEDecode -> SaveImage, shaped like the Flux workflow."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "2": {"class_type": "DualCLIPLoader", "inputs": {
            "clip_name1": "clip_l.safetensors", "clip_name2": "t5xxl_fp16.safetensors",
            "type": "flux"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["2", 0], "text": "a red fox"}},
        "5": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["4", 0]}},
        "6": {"class_type": "EmptySD3LatentImage",
              "inputs": {"width": 256, "height": 128, "batch_size": 1}},
        "7": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "positive": ["4", 0], "negative": ["5", 0],
            "latent_image": ["6", 0], "seed": 7, "steps": steps, "cfg": 1.0,
            "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["3", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "f"}},
    }


def png_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "PNG"
        return img.size


async def test_run_saves_a_real_png_of_the_requested_size(fake_comfy: FakeComfyUI) -> None:
    seen: list[events.Event] = []
    async with comfy_client.ComfyClient(fake_comfy.url, name="gpu0") as client:
        result = await client.run(empty_image(64, 48), on_event=seen.append)
        result.raise_for_status()
        assert result.status == "success"
        assert len(result.outputs) == 1
        out = result.outputs[0]
        assert (out.node_id, out.kind, out.type) == ("2", "image", "output")
        assert out.filename == "probe_00001_.png"
        assert png_size(await client.download(out)) == (64, 48)
    kinds = [type(e).__name__ for e in seen]
    # the queue position comes first, unless the job already finished when it was asked
    assert kinds[0] in ("QueuePosition", "ExecutionStart")
    assert kinds.index("ExecutionStart") < kinds.index("Executed") < kinds.index("ExecutionSuccess")
    assert isinstance(seen[-1], events.Executing) and seen[-1].node is None
    assert result.timings.execution_start_ms is not None
    assert result.timings.duration_ms is not None and result.timings.duration_ms >= 0
    assert set(result.timings.node_ms) == {"1", "2"}
    assert fake_comfy.executions[result.prompt_id] == 1


async def test_model_workflow_reports_steps_and_decodes_latent_size(
    fake_comfy_factory: FakeFactory,
) -> None:
    fake = await fake_comfy_factory(step_delay=0.01)
    progress: list[events.Progress] = []

    def on_event(event: events.Event) -> None:
        if isinstance(event, events.Progress):
            progress.append(event)

    async with comfy_client.ComfyClient(fake.url, name="gpu0") as client:
        result = (await client.run(mini_model(steps=5), on_event=on_event)).raise_for_status()
        assert [p.value for p in progress] == [1, 2, 3, 4, 5]
        assert all(p.max == 5 and p.node == "7" for p in progress)
        # Measured from when the events arrive, so load moves it either way; the arithmetic
        # is checked exactly in tests/unit/test_events.py.
        rate = result.timings.iterations_per_second()
        assert rate is not None and rate > 0
        assert png_size(await client.download(result.outputs[0])) == (256, 128)
        node_ms = result.timings.node_ms
        assert node_ms["7"] == max(node_ms.values())  # the sampler is the slow node


async def test_speed_factor_makes_the_same_job_faster(fake_comfy_factory: FakeFactory) -> None:
    # Ten times faster: the slow one sleeps at least 1 s, the fast one 0.1 s, so the fast
    # one wins unless a loaded machine adds most of a second to it alone.
    slow = await fake_comfy_factory(step_delay=0.2, speed=1.0)
    fast = await fake_comfy_factory(step_delay=0.2, speed=0.1)
    timings = []
    for fake in (slow, fast):
        async with comfy_client.ComfyClient(fake.url) as client:
            result = (await client.run(mini_model(steps=5))).raise_for_status()
            assert result.timings.duration_ms is not None
            timings.append(result.timings.duration_ms)  # server-side timestamps
    assert timings[0] >= 5 * 0.2 * 1000 * 0.99  # sleeps are never shorter than asked
    assert timings[1] >= 5 * 0.02 * 1000 * 0.99
    assert timings[1] < timings[0]


async def test_upload_then_load_invert_save(fake_comfy: FakeComfyUI) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (20, 10), (255, 255, 255)).save(buffer, "PNG")
    async with comfy_client.ComfyClient(fake_comfy.url) as client:
        first = await client.upload_image(buffer.getvalue(), "photo.png")
        again = await client.upload_image(buffer.getvalue(), "photo.png")
        other = await client.upload_image(b"different bytes", "photo.png")
        assert first == again == results.UploadedFile("photo.png", "", "input")
        assert other.name == "photo (1).png"
        result = (await client.run(invert(first.reference))).raise_for_status()
        out = result.outputs[0]
        assert out.subfolder == "inv"
        with Image.open(io.BytesIO(await client.download(out))) as img:
            assert img.size == (20, 10)
            assert img.convert("RGB").getpixel((0, 0)) == (0, 0, 0)


async def test_upload_over_the_limit_names_the_limit(fake_comfy_factory: FakeFactory) -> None:
    fake = await fake_comfy_factory(max_upload_size=1024 * 1024)
    async with comfy_client.ComfyClient(fake.url, name="gpu1") as client:
        with pytest.raises(errors.UploadTooLarge) as info:
            await client.upload_image(b"x" * (2 * 1024 * 1024), "big.png")
    assert info.value.limit == 1024 * 1024
    assert str(info.value) == "the file is larger than backend gpu1 accepts (limit 1 MB)"
    assert (await _features(fake))["max_upload_size"] == 1048576.0


async def _features(fake: FakeComfyUI) -> dict[str, Any]:
    async with comfy_client.ComfyClient(fake.url) as client:
        return await client.features()


async def test_missing_model_is_rejected_in_plain_words(fake_comfy_factory: FakeFactory) -> None:
    fake = await fake_comfy_factory(models={"diffusion_models": ["flux1-dev.safetensors"],
                                            "text_encoders": ["clip_l.safetensors",
                                                              "t5xxl_fp16.safetensors"],
                                            "vae": ["ae.safetensors"]})
    async with comfy_client.ComfyClient(fake.url, name="gpu0") as client:
        with pytest.raises(errors.WorkflowRejected) as info:
            await client.run(mini_model())
        assert await client.models("diffusion_models") == ["flux1-dev.safetensors"]
    err = info.value
    assert err.missing_models == ["flux1-schnell.safetensors"]
    assert "model file flux1-schnell.safetensors is not installed on backend gpu0" in str(err)
    assert err.transient is False
    assert fake.prompts == []


async def test_unknown_node_bounds_and_missing_image(fake_comfy: FakeComfyUI) -> None:
    async with comfy_client.ComfyClient(fake_comfy.url, name="gpu0") as client:
        bad_node = {"1": {"class_type": "NoSuchNode", "inputs": {}}}
        with pytest.raises(errors.WorkflowRejected) as info:
            await client.submit(bad_node)
        assert info.value.missing_nodes == ["NoSuchNode"]
        assert str(info.value) == "node type NoSuchNode is not installed on backend gpu0"

        with pytest.raises(errors.WorkflowRejected) as info:
            await client.submit(mini_model(steps=-5))
        assert str(info.value) == "steps: Value -5 smaller than min of 1 (node 7, KSampler)"

        with pytest.raises(errors.WorkflowRejected) as info:
            await client.submit(invert("photo.png"))
        assert str(info.value) == "input image photo.png is missing on backend gpu0"


async def test_partially_valid_prompt_is_rejected_and_not_left_queued(
    fake_comfy: FakeComfyUI,
) -> None:
    prompt = {**empty_image(), "3": {"class_type": "LoadImage", "inputs": {"image": "gone.png"}},
              "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}}}
    fake_comfy.pause()
    async with comfy_client.ComfyClient(fake_comfy.url, name="gpu0") as client:
        with pytest.raises(errors.WorkflowRejected) as info:
            await client.submit(prompt)
        assert "gone.png" in str(info.value)
        assert (await client.queue()).pending == ()


async def test_execution_error_becomes_execution_failed(fake_comfy: FakeComfyUI) -> None:
    fake_comfy.fail_next_execution(node_type="SaveImage", message="disk full\nTraceback...")
    async with comfy_client.ComfyClient(fake_comfy.url, name="gpu0") as client:
        result = await client.run(empty_image())
        assert result.status == "error"
        assert result.outputs == ()
        with pytest.raises(errors.ExecutionFailed) as info:
            result.raise_for_status()
        history = await client.history(result.prompt_id)
    assert str(info.value) == "node 2 (SaveImage) failed on backend gpu0: disk full"
    assert info.value.transient is False
    assert history is not None and history["status"]["status_str"] == "error"


async def test_saving_outside_output_folder_fails_like_comfyui(fake_comfy: FakeComfyUI) -> None:
    async with comfy_client.ComfyClient(fake_comfy.url, name="gpu0") as client:
        result = await client.run(empty_image(prefix="../../escape"))
    assert result.error is not None and result.error.node_type == "SaveImage"
    assert "outside the output folder" in result.error.exception_message


async def test_interrupt_only_stops_the_running_prompt(fake_comfy_factory: FakeFactory) -> None:
    fake = await fake_comfy_factory(step_delay=0.05)
    async with comfy_client.ComfyClient(fake.url, name="gpu0") as client:
        started = asyncio.Event()

        def on_event(event: events.Event) -> None:
            if isinstance(event, events.Progress):
                started.set()

        first = asyncio.create_task(client.run(mini_model(steps=40), on_event=on_event))
        second = asyncio.create_task(client.run(empty_image(prefix="second")))
        await asyncio.wait_for(started.wait(), 5)
        state = await client.queue()
        waiting = state.pending[0].prompt_id
        assert await client.interrupt(waiting) is False  # not running: nothing sent
        running = state.running[0].prompt_id
        assert await client.interrupt(running) is True
        interrupted, done = await asyncio.gather(first, second)
    assert interrupted.status == "interrupted"
    assert interrupted.interruption is not None and interrupted.interruption.node_id == "7"
    with pytest.raises(errors.Interrupted):
        interrupted.raise_for_status()
    assert done.status == "success"
    assert fake.interrupts == [{"prompt_id": running}]


async def test_queue_positions_follow_number_not_heap_order(fake_comfy: FakeComfyUI) -> None:
    fake_comfy.pause()
    async with comfy_client.ComfyClient(fake_comfy.url) as client:
        a = await client.submit(empty_image(prefix="a"))
        b = await client.submit(empty_image(prefix="b"))
        c = await client.submit(empty_image(prefix="c"), front=True)
        assert (a.number, b.number, c.number) == (0, 1, -2)
        state = await client.queue()
        assert [i.prompt_id for i in state.pending] == [c.prompt_id, a.prompt_id, b.prompt_id]
        assert await client.queue_position(c.prompt_id) == 1
        assert await client.queue_position(b.prompt_id) == 3
        await client.delete_queued([a.prompt_id])
        assert await client.queue_position(b.prompt_id) == 2
        await client.clear_queue()
        assert (await client.queue()).pending == ()
        assert await client.history(b.prompt_id) is None


async def test_follow_reattaches_to_a_prompt_submitted_elsewhere(
    fake_comfy_factory: FakeFactory,
) -> None:
    fake = await fake_comfy_factory(step_delay=0.02)
    positions: list[int] = []

    def on_event(event: events.Event) -> None:
        if isinstance(event, events.QueuePosition):
            positions.append(event.position)

    async with comfy_client.ComfyClient(fake.url, poll_interval=0.01) as submitter, \
            comfy_client.ComfyClient(fake.url, poll_interval=0.01) as worker:
        first = await submitter.submit(mini_model(steps=10))
        second = await submitter.submit(empty_image())
        result = await worker.follow(second.prompt_id, on_event=on_event)
        assert result.status == "success"
        assert png_size(await worker.download(result.outputs[0])) == (64, 48)
        assert positions[0] == 1 and positions[-1] in (0, 1)
        done = await worker.follow(first.prompt_id)  # already finished: from history
        assert done.status == "success" and done.outputs[0].filename.startswith("f_")
        with pytest.raises(errors.JobLost):
            await worker.follow("never-submitted")


async def test_dropped_socket_mid_job_is_reconciled(fake_comfy_factory: FakeFactory) -> None:
    fake = await fake_comfy_factory(step_delay=0.03)
    async with comfy_client.ComfyClient(fake.url, poll_interval=0.02) as client:
        started = asyncio.Event()

        def on_event(event: events.Event) -> None:
            if isinstance(event, events.Progress):
                started.set()

        job = asyncio.create_task(client.run(mini_model(steps=10), on_event=on_event))
        await asyncio.wait_for(started.wait(), 5)
        await fake.drop_sockets()
        result = await asyncio.wait_for(job, 10)
        assert result.status == "success"
        assert png_size(await client.download(result.outputs[0])) == (256, 128)
        assert fake.executions[result.prompt_id] == 1  # followed, not run again
        again = await client.run(empty_image())  # a fresh socket, fresh client id
        assert again.status == "success"
    client_ids = [p["extra_data"]["client_id"] for p in fake.prompts]
    assert client_ids[0] != client_ids[1]


async def test_killed_backend_is_unreachable_and_restart_loses_the_job(
    fake_comfy_factory: FakeFactory,
) -> None:
    fake = await fake_comfy_factory(step_delay=0.05)
    async with comfy_client.ComfyClient(fake.url, name="gpu3", poll_interval=0.02,
                                        timeout=2) as client:
        submitted = await client.submit(mini_model(steps=50))
        job = asyncio.create_task(client.run(mini_model(steps=50, unet="flux1-dev.safetensors")))
        await asyncio.sleep(0.1)
        await fake.kill()
        with pytest.raises(errors.BackendUnreachable) as info:
            await asyncio.wait_for(job, 10)
        assert str(info.value) == "backend gpu3 cannot be reached"
        assert info.value.transient is True
        await fake.restart()
        with pytest.raises(errors.JobLost) as lost:
            await client.follow(submitted.prompt_id)
        assert lost.value.transient is True


async def test_cleared_job_is_reported_lost_instead_of_hanging(fake_comfy: FakeComfyUI) -> None:
    fake_comfy.pause()
    async with comfy_client.ComfyClient(fake_comfy.url, check_interval=0.05) as client:
        job = asyncio.create_task(client.run(empty_image()))
        for _ in range(500):
            if fake_comfy.prompts:
                break
            await asyncio.sleep(0.01)
        assert fake_comfy.prompts, "the prompt never reached the backend"
        await client.clear_queue()
        with pytest.raises(errors.JobLost):
            await asyncio.wait_for(job, 5)


async def test_no_origin_or_user_agent_header_reaches_the_backend(fake_comfy: FakeComfyUI) -> None:
    async with comfy_client.ComfyClient(fake_comfy.url) as client:
        (await client.run(empty_image())).raise_for_status()
    assert any(r.path == "/ws" for r in fake_comfy.requests)
    assert any(r.path == "/prompt" for r in fake_comfy.requests)
    assert all("Origin" not in r.headers for r in fake_comfy.requests)
    # neither the library nor its version tells the backend what talks to it
    assert all("User-Agent" not in r.headers for r in fake_comfy.requests)


async def test_fake_refuses_a_foreign_origin_like_comfyui(fake_comfy: FakeComfyUI) -> None:
    import httpx

    async with httpx.AsyncClient() as http:
        port = fake_comfy.port
        refused = await http.get(f"{fake_comfy.url}/queue",
                                 headers={"Origin": f"http://localhost:{port}"})
        same = await http.get(f"{fake_comfy.url}/api/queue",
                              headers={"Origin": f"http://127.0.0.1:{port}"})
        bad_json = await http.post(f"{fake_comfy.url}/prompt", content=b"{nope")
        unknown = await http.get(f"{fake_comfy.url}/history/nope")
    assert (refused.status_code, refused.content) == (403, b"")
    assert same.status_code == 200
    assert bad_json.status_code == 500 and bad_json.headers["content-type"].startswith("text/plain")
    assert (unknown.status_code, unknown.json()) == (200, {})


async def test_unreachable_port_is_backend_unreachable() -> None:
    # Bound but not listening, and held: connections are refused, and no other process
    # can take the port while the test runs.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        async with comfy_client.ComfyClient(f"http://127.0.0.1:{port}", name="gpu9",
                                            timeout=2) as client:
            with pytest.raises(errors.BackendUnreachable,
                               match="backend gpu9 cannot be reached"):
                await client.system_stats()
            with pytest.raises(errors.BackendUnreachable):
                await client.run(empty_image())


async def test_proxy_that_hangs_up_is_backend_unreachable() -> None:
    """A dying anon accepts the SOCKS connection and closes it without a reply."""
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, comfy_client.ComfyClient(
        "http://127.0.0.1:1", name="hidden", proxy=f"socks5://127.0.0.1:{port}", timeout=2
    ) as client:
        with pytest.raises(errors.BackendUnreachable, match="backend hidden cannot be reached"):
            await client.queue()
        with pytest.raises(errors.BackendUnreachable):
            await client.run(empty_image())


async def test_missing_output_file_is_file_not_found(fake_comfy: FakeComfyUI) -> None:
    async with comfy_client.ComfyClient(fake_comfy.url, name="gpu0") as client:
        missing = results.OutputFile("2", "nothing.png", "", "output", "image")
        with pytest.raises(errors.FileNotFound, match=r"backend gpu0 has no file nothing\.png"):
            await client.download(missing)


async def test_binary_previews_arrive_with_metadata(fake_comfy_factory: FakeFactory) -> None:
    fake = await fake_comfy_factory(previews=True)
    previews: list[events.Preview] = []

    def on_event(event: events.Event) -> None:
        if isinstance(event, events.Preview):
            previews.append(event)

    async with comfy_client.ComfyClient(fake.url) as client:
        result = (await client.run(mini_model(steps=3), on_event=on_event)).raise_for_status()
    assert len(previews) == 3
    assert {p.prompt_id for p in previews} == {result.prompt_id}
    assert all(p.mime == "image/png" and p.node_id == "7" for p in previews)
    assert png_size(previews[0].image) == (8, 8)


async def test_cached_rerun_replays_outputs_without_executing(fake_comfy: FakeComfyUI) -> None:
    async with comfy_client.ComfyClient(fake_comfy.url) as client:
        first = (await client.run(empty_image())).raise_for_status()
        again = (await client.run(empty_image())).raise_for_status()
    assert again.outputs[0].filename == first.outputs[0].filename
    assert set(again.timings.cached_nodes) == {"1", "2"}
    assert again.timings.node_ms == {"1": 0.0, "2": 0.0}


async def test_video_outputs_are_classified_as_video(fake_comfy: FakeComfyUI) -> None:
    prompt = {
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": 32, "height": 32, "batch_size": 4, "color": 0}},
        "2": {"class_type": "CreateVideo", "inputs": {"images": ["1", 0], "fps": 16.0}},
        "3": {"class_type": "SaveVideo", "inputs": {"video": ["2", 0],
              "filename_prefix": "video/clip", "format": "auto", "codec": "auto"}},
    }
    async with comfy_client.ComfyClient(fake_comfy.url) as client:
        result = (await client.run(prompt)).raise_for_status()
        (out,) = result.outputs
        assert (out.kind, out.subfolder) == ("video", "video")
        assert out.filename.endswith(".mp4")
        chunks = [chunk async for chunk in client.stream(out)]
    # a playable H.264 MP4, with the prompt in its tags as ComfyUI's SaveVideo writes it
    with av.open(io.BytesIO(b"".join(chunks))) as video:
        assert video.streams.video[0].codec_context.name == "h264"
        assert [(f.width, f.height) for f in video.decode(video=0)] == [(32, 32)] * 4
        assert "EmptyImage" in video.metadata["prompt"]


# --- the same model-free scenarios against the fake, and a real ComfyUI when asked ---------
#
#   COMFYUI_URL=http://127.0.0.1:8188 pytest -m real_comfyui tests/integration/test_comfy_client.py
#
# The real server keeps its cache between tests, so each run uses values of its own.


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.real_comfyui)])
async def comfy_url(request: pytest.FixtureRequest, fake_comfy_factory: FakeFactory) -> str:
    """The fake's URL, or COMFYUI_URL for the real_comfyui variant (skipped without it)."""
    if request.param == "real":
        url = os.environ.get("COMFYUI_URL")
        if not url:
            pytest.skip("COMFYUI_URL is not set")
        return url
    # ImageBlur stands in for the seconds a 1024x1024 blur takes on a real CPU.
    fake = await fake_comfy_factory(delays={"ImageBlur": 1.0})
    return fake.url


def _tag() -> int:
    """A colour no earlier run used, so the real server's cache cannot answer."""
    return int.from_bytes(os.urandom(3), "big")


def slow_blur(tag: int, prefix: str = "comfyveil_slow") -> dict[str, Any]:
    """Model-free and seconds long on a real CPU: a big image, a wide blur, a save."""
    return {
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": 1024, "height": 1024, "batch_size": 1, "color": tag}},
        "2": {"class_type": "ImageBlur",
              "inputs": {"image": ["1", 0], "blur_radius": 31, "sigma": 10.0}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": prefix}},
    }


async def _settled(client: comfy_client.ComfyClient, prompt_id: str) -> dict[str, Any] | None:
    """Wait until the prompt neither runs nor waits; its history entry, if it ran."""
    for _ in range(600):
        if (await client.queue()).position(prompt_id) is None:
            return await client.history(prompt_id)
        await asyncio.sleep(0.1)
    raise AssertionError(f"{prompt_id} still queued after 60 s")


async def test_model_free_run_reports_events_in_order(comfy_url: str) -> None:
    seen: list[events.Event] = []
    tag = _tag()
    async with comfy_client.ComfyClient(comfy_url, name="b") as client:
        result = await client.run(
            {**empty_image(40, 24, prefix="comfyveil_probe"),
             "1": {"class_type": "EmptyImage",
                   "inputs": {"width": 40, "height": 24, "batch_size": 1, "color": tag}}},
            on_event=seen.append)
        result.raise_for_status()
        assert len(result.outputs) == 1
        assert png_size(await client.download(result.outputs[0])) == (40, 24)
        assert (await client.history("comfyveil-never-submitted")) is None
    mine = [e for e in seen if not isinstance(e, (events.Status, events.QueuePosition,
                                                  events.ProgressState))]
    assert [type(e).__name__ for e in mine] == [
        "ExecutionStart", "ExecutionCached", "Executing", "Executing", "Executed",
        "ExecutionSuccess", "Executing"]
    assert [e.node for e in mine if isinstance(e, events.Executing)] == ["1", "2", None]
    finished = [e for e in seen if isinstance(e, events.ProgressState)][-1]
    assert {n.state for n in finished.nodes.values()} == {"finished"}


async def test_values_are_checked_like_comfyui(comfy_url: str) -> None:
    def sized(width: Any) -> dict[str, Any]:
        return {"1": {"class_type": "EmptyImage",
                      "inputs": {"width": width, "height": 8, "batch_size": 1, "color": _tag()}},
                "2": {"class_type": "SaveImage",
                      "inputs": {"images": ["1", 0], "filename_prefix": "comfyveil_size"}}}

    async with comfy_client.ComfyClient(comfy_url, name="b") as client:
        with pytest.raises(errors.WorkflowRejected) as small:
            await client.submit(sized(-1))
        assert small.value.node_errors["1"]["errors"][0]["type"] == "value_smaller_than_min"
        with pytest.raises(errors.WorkflowRejected) as text:
            await client.submit(sized("40.5"))
        assert text.value.node_errors["1"]["errors"][0]["type"] == "invalid_input_type"
        with pytest.raises(errors.WorkflowRejected) as unknown:
            await client.submit({"1": {"class_type": "NoSuchNode", "inputs": {}}})
        assert unknown.value.missing_nodes == ["NoSuchNode"]
        # a float for an INT is accepted and truncated: int(40.5) == 40
        result = (await client.run(sized(40.5))).raise_for_status()
        assert png_size(await client.download(result.outputs[0])) == (40, 8)


async def test_partially_valid_prompt_never_produces_its_valid_outputs(comfy_url: str) -> None:
    # The valid branch starts at once on an idle server: POST /queue delete cannot stop
    # it, only an interrupt can.
    tag = _tag()
    prompt = {**slow_blur(tag, prefix="comfyveil_partial"),
              "8": {"class_type": "EmptyImage",
                    "inputs": {"width": -1, "height": 8, "batch_size": 1, "color": tag}},
              "9": {"class_type": "PreviewImage", "inputs": {"images": ["8", 0]}}}
    pid = f"comfyveil-partial-{tag}"
    async with comfy_client.ComfyClient(comfy_url, name="b") as client:
        with pytest.raises(errors.WorkflowRejected) as info:
            await client.submit(prompt, prompt_id=pid)
        assert list(info.value.node_errors) == ["8"]
        history = await _settled(client, pid)
    # Either it was taken off the queue before it started (no history at all), or it had
    # started and was interrupted; never did its valid branch save anything.
    outcome = None if history is None else (
        history["outputs"], history["status"]["status_str"],
        "execution_interrupted" in [m[0] for m in history["status"]["messages"]],
    )
    assert outcome in (None, ({}, "error", True)), outcome


async def test_interrupt_stops_the_running_prompt_only(comfy_url: str) -> None:
    tag = _tag()
    async with comfy_client.ComfyClient(comfy_url, name="b") as client:
        running = await client.submit(slow_blur(tag), prompt_id=f"comfyveil-a-{tag}")
        waiting = await client.submit(slow_blur(tag + 1), prompt_id=f"comfyveil-b-{tag}")
        for _ in range(100):
            if (await client.queue()).position(running.prompt_id) == 0:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the first prompt never started")
        assert await client.interrupt(waiting.prompt_id) is False  # waits: nothing sent
        assert await client.interrupt(running.prompt_id) is True
        stopped = await _settled(client, running.prompt_id)
        done = await _settled(client, waiting.prompt_id)
    assert stopped is not None and stopped["status"]["status_str"] == "error"
    assert stopped["outputs"] == {}
    assert [m[0] for m in stopped["status"]["messages"]][-1] == "execution_interrupted"
    assert done is not None and done["status"]["status_str"] == "success"
    assert list(done["outputs"]) == ["3"]


async def test_image_invert_pixels_match_comfyui_float32_arithmetic(comfy_url: str) -> None:
    # ComfyUI turns pixels into float32 x/255, inverts 1-x, saves trunc(255*x): often one
    # less than 255-v. Computed here with numpy float32, independently of the fake.
    values = np.arange(256, dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(np.stack([values] * 3, axis=-1)[None, :, :], "RGB").save(buffer, "PNG")
    expected = (255.0 * (1.0 - values.astype(np.float32) / 255.0)).astype(np.uint8)
    assert (expected != 255 - values).any()
    async with comfy_client.ComfyClient(comfy_url, name="b") as client:
        up = await client.upload_image(buffer.getvalue(), f"comfyveil-ramp-{_tag()}.png")
        result = (await client.run(invert(up.reference))).raise_for_status()
        with Image.open(io.BytesIO(await client.download(result.outputs[0]))) as img:
            got = np.asarray(img.convert("RGB"))[0, :, 0]
    assert got.tolist() == expected.tolist()


async def test_a_job_that_starts_at_once_asks_no_queue_position(
    fake_comfy: FakeComfyUI,
) -> None:
    seen: list[events.Event] = []
    async with comfy_client.ComfyClient(fake_comfy.url) as client:
        (await client.run(empty_image(), on_event=seen.append)).raise_for_status()
    asked = [r for r in fake_comfy.requests
             if r.method == "GET" and r.path in ("/prompt", "/queue")]
    assert asked == []  # an idle backend started it before the grace ran out
    assert not any(isinstance(e, events.QueuePosition) for e in seen)


async def test_run_reports_its_place_behind_a_busy_backend(
    fake_comfy_factory: FakeFactory,
) -> None:
    fake = await fake_comfy_factory(step_delay=0.05)
    positions: list[int] = []

    def on_event(event: events.Event) -> None:
        if isinstance(event, events.QueuePosition):
            positions.append(event.position)

    async with comfy_client.ComfyClient(fake.url) as busy, \
            comfy_client.ComfyClient(fake.url) as mine:
        await busy.submit(mini_model(steps=10))  # half a second of GPU work ahead of us
        result = await mine.run(empty_image(), on_event=on_event)
    assert result.status == "success"
    assert positions and positions[0] == 1  # told it waits behind one job
