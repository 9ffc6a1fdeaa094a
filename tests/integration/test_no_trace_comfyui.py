"""A model-free job with no trace, then a look at what the server still holds: its
history, its output folder, the input. Runs on the fake, and on a real ComfyUI with

    COMFYUI_URL=http://127.0.0.1:8188 pytest -m real_comfyui \
        tests/integration/test_no_trace_comfyui.py
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from PIL import Image, ImageChops

from comfyveil.comfy import bindings, execute, notrace, uploads
from comfyveil.comfy import client as comfy_client
from tests.fixtures.comfy import FakeFactory

DATA = Path(__file__).parents[1] / "data" / "workflows"


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.real_comfyui)])
async def comfy_url(request: pytest.FixtureRequest, fake_comfy_factory: FakeFactory) -> str:
    if request.param == "real":
        url = os.environ.get("COMFYUI_URL")
        if not url:
            pytest.skip("COMFYUI_URL is not set")
        return url
    return (await fake_comfy_factory()).url


def photo_with_gps(tag: int) -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "PhoneMaker"
    exif[0x8825] = {1: "N", 2: (48.0, 51.0, 24.0), 3: "E", 4: (2.0, 21.0, 3.0)}
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (tag % 256, 90, 200)).save(out, "PNG", exif=exif.tobytes())
    return out.getvalue()


async def test_a_model_free_job_leaves_nothing_in_history_output_or_input(
    comfy_url: str, tmp_path: Path
) -> None:
    tag = int.from_bytes(os.urandom(3), "big")  # the real server's cache cannot answer
    prefix = f"comfyveil/notrace-{tag}"
    graph = json.loads((DATA / "invert.json").read_text())
    graph["3"]["inputs"]["filename_prefix"] = prefix
    (tmp_path / "invert.json").write_text(json.dumps(graph))
    (tmp_path / "invert.toml").write_text((DATA / "invert.toml").read_text())
    wf = bindings.load(tmp_path / "invert.toml")
    sent = photo_with_gps(tag)
    async with comfy_client.ComfyClient(comfy_url, name="probe") as client:
        inputs_before = await _input_files(client)
        outcome = await execute.execute(
            client, wf, {}, {"image": uploads.InputImage(sent, "image/png")}, no_trace=True
        )
        prompt_id = outcome.result.prompt_id

        # The result came back, inverted, without metadata.
        (result,) = outcome.files
        with Image.open(io.BytesIO(result.data)) as got, Image.open(io.BytesIO(sent)) as was:
            assert set(got.info) <= {"dpi", "icc_profile"} and not got.getexif()
            inverted = ImageChops.invert(was.convert("RGB"))
            difference = ImageChops.difference(got.convert("RGB"), inverted)
            assert max(high for _, high in difference.getextrema()) <= 1  # float32 rounding

        # History: not there, not even in the full list.
        assert await client.history(prompt_id) is None
        everything = await client._call("GET", "/history")
        assert prompt_id not in everything

        # Temp: the image came from there (a PreviewImage in place of the SaveImage), and
        # is a 1x1 image now.
        (saved,) = outcome.result.outputs
        assert saved.type == "temp" and saved.node_id == "3"
        gone = await client._send(
            "GET",
            "/view",
            params={"filename": saved.filename, "subfolder": saved.subfolder, "type": "temp"},
        )
        with Image.open(io.BytesIO(gone.body)) as placeholder:
            assert placeholder.size == (1, 1)

        # Output: SaveImage never ran, so the file it would have written does not exist.
        missing = await client._send(
            "GET",
            "/view",
            params={
                "filename": f"notrace-{tag}_00001_.png",
                "subfolder": "comfyveil",
                "type": "output",
            },
        )
        assert missing.status == 404

        # Input: nothing new in input/, and the upload in temp/ is a 1x1 image now.
        assert await _input_files(client) == inputs_before
        name, _, folder = outcome.uploaded["image"].rpartition(" [")
        assert folder == "temp]"
        left = await client._send("GET", "/view", params={"filename": name, "type": "temp"})
        with Image.open(io.BytesIO(left.body)) as placeholder:
            assert placeholder.size == (1, 1)


async def _input_files(client: comfy_client.ComfyClient) -> list[str]:
    """The files in the server's input/ (LoadImage's list is read live)."""
    info = await client._call("GET", "/object_info/LoadImage")
    return sorted(info["LoadImage"]["input"]["required"]["image"][0])


async def test_without_save_image_websocket_the_files_are_overwritten_once_home(
    fake_comfy_factory: FakeFactory,
) -> None:
    fake = await fake_comfy_factory()
    del fake._node_defs["SaveImageWebsocket"]  # a server without the node
    wf = bindings.load(DATA / "invert.toml")
    async with comfy_client.ComfyClient(fake.url, name="old") as client:
        outcome = await execute.execute(
            client,
            wf,
            {},
            {"image": uploads.InputImage(photo_with_gps(1), "image/png")},
            no_trace="memory",  # what the operator's choice falls back to without the node
        )
    (result,) = outcome.files
    assert result.file.type == "output"  # written by SaveImage, then downloaded
    with Image.open(io.BytesIO(result.data)) as image:
        assert image.size == (64, 48) and "prompt" not in image.info
    (written,) = fake.dirs["output"].rglob("*.png")
    with Image.open(written) as placeholder:
        assert placeholder.size == (1, 1)
    assert fake.history_entries == {}


async def test_a_deaf_socket_loses_one_job_and_is_replaced(
    fake_comfy_factory: FakeFactory,
) -> None:
    """A socket whose id another connection took over (and then closed) stays open but
    hears nothing: the job's images are lost, and the next job gets a new socket."""
    fake = await fake_comfy_factory()
    wf = bindings.load(DATA / "invert.toml")
    image = {"image": uploads.InputImage(photo_with_gps(2), "image/png")}
    async with comfy_client.ComfyClient(fake.url, name="gpu0", check_interval=0.3) as client:
        # Sockets matter only to `no_trace = "memory"`, the operator's choice.
        await execute.execute(client, wf, {}, image, no_trace="memory")
        deaf = client.client_id
        assert deaf is not None
        fake.sockets.pop(deaf)  # what the server does when the thief's socket closes
        with pytest.raises(notrace.FramesLost):
            await execute.execute(client, wf, {}, image, no_trace="memory")
        outcome = await execute.execute(client, wf, {}, image, no_trace="memory")
        assert client.client_id != deaf and len(outcome.files) == 1
    assert fake.history_entries == {}


async def test_the_same_prompt_twice_brings_a_real_image_both_times(
    fake_comfy_factory: FakeFactory,
) -> None:
    """ComfyUI's cache would answer the second run with the first run's file name, whose
    file is a 1x1 image by then: each run's savers carry a fresh input of their own."""
    from comfyveil.comfy import workflow

    fake = await fake_comfy_factory()
    wf = workflow.find("f")
    values = wf.validate({"prompt": "a fox", "steps": 1, "seed": 7, "width": 256, "height": 256})
    async with comfy_client.ComfyClient(fake.url, name="gpu0") as client:
        for _ in range(2):
            outcome = await execute.execute(client, wf, values, no_trace=True)
            (result,) = outcome.files
            with Image.open(io.BytesIO(result.data)) as image:
                assert image.size == (256, 256)
    first, second = (p["prompt"] for p in fake.prompts)
    assert {k for k in first if first[k] != second[k]} == {
        k for k, n in first.items() if n["class_type"] == "PreviewImage"
    }
