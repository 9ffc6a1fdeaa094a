"""`comfyveil generate` as a user runs it: a subprocess against the fake ComfyUI."""

from __future__ import annotations

import asyncio
import io
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from tests import zygote
from tests.fakes.comfyui import FakeComfyUI


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str


async def comfyveil(*args: str, cwd: Path) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYVEIL_")}
    env["COMFYVEIL_DATA_DIR"] = str(cwd / "data")
    proc = await zygote.comfyveil(
        *args,
        cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def png(width: int, height: int, color: str = "red") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, "PNG")
    return buffer.getvalue()


def assert_one_plain_line(run: Run) -> str:
    """The error is one `comfyveil: ...` line, the last thing printed (progress may precede it)."""
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert "Traceback" not in run.stderr
    errors = [line for line in lines if line.startswith("comfyveil: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], run.stderr
    return errors[0]


async def test_flux_prompt_saves_a_real_image_and_prints_its_path(
    fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run = await comfyveil(
        "generate", "f", "an", "astronaut", "--set", "steps=2", "--set", "width=512",
        "--set", "height=256", "--server", fake_comfy.url, "--out", str(out), cwd=tmp_path,
    )
    assert run.code == 0, run.stderr
    paths = [Path(line) for line in run.stdout.splitlines()]
    assert len(paths) == 1 and paths[0].parent == out
    with Image.open(paths[0]) as image:
        assert image.size == (512, 256)
    (submitted,) = fake_comfy.prompts
    # Named by command, run and index, not by whatever name the server drew.
    assert paths[0].name == f"f-{submitted['prompt_id'][:8]}-1.png"
    assert sorted(p.name for p in out.iterdir()) == [paths[0].name]
    graph = submitted["prompt"]
    texts = [n["inputs"].get("clip_l") for n in graph.values() if "clip_l" in n["inputs"]]
    assert texts == ["an astronaut"]
    assert all(n["inputs"].get("steps", 2) == 2 for n in graph.values())
    # Progress shows the sampler's steps, not the saver ticking once as it sends the image.
    assert "KSampler step 2/2 (100%)" in run.stderr.splitlines()
    assert "SaveImage step" not in run.stderr and "step 0/1" not in run.stderr, run.stderr


async def test_edit_workflow_uploads_the_image_under_a_name_that_says_nothing(
    fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    photo = tmp_path / "my holiday photo.png"
    photo.write_bytes(png(96, 64))
    run = await comfyveil(
        "generate", "qwen", "put a hat on it", "--image", str(photo), "--set", "steps=1",
        "--server", fake_comfy.url, "--out", str(tmp_path / "out"), cwd=tmp_path,
    )
    assert run.code == 0, run.stderr
    upload, *overwrites = fake_comfy.uploads  # the photo, then 1x1 images over it and the result
    assert "holiday" not in str(upload)  # the user's file name never reaches the GPU host
    (overwrite,) = [o for o in overwrites if o["name"] == upload["name"]]
    assert overwrite["size"] < 100
    (submitted,) = fake_comfy.prompts
    loads = [n for n in submitted["prompt"].values() if n["class_type"] == "LoadImage"]
    assert loads and loads[0]["inputs"]["image"] == f"{upload['name']} [temp]"
    assert upload["name"].startswith("comfyveil-")
    assert Path(run.stdout.strip()).exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nosuchflow", "x"], "unknown workflow nosuchflow"),
        (["f", "a fox", "--set", "steps=99"], "steps"),
        (["f", "a fox", "--set", "colour=red"], "unknown option --colour"),
        (["f", "a fox", "--set", "steps"], "NAME=VALUE"),
        (["f"], "prompt is required"),
        (["qwen", "edit it", "--image", "doc.pdf"], "not an image"),
        (["f", "a fox", "--image", "ok.png"], "takes no image"),
        # Checked before the job runs, not after the GPU did the work (issue 23 items 4, 10).
        (["f", "a fox", "--out", "ok.png"], "--out ok.png is a file, not a folder"),
        (["f", "a fox", "--out", "ok.png/below"], "--out ok.png/below: ok.png is a file"),
        (["f", "a fox", "--timeout", "0"], "--timeout must be more than 0 seconds"),
        (["f", "a fox", "--timeout", "-5"], "--timeout must be more than 0 seconds"),
    ],
)
async def test_usage_errors_exit_2_with_one_plain_line(
    args: list[str], expected: str, fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    (tmp_path / "doc.pdf").write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n%%EOF")
    (tmp_path / "ok.png").write_bytes(png(8, 8))
    run = await comfyveil("generate", *args, "--server", fake_comfy.url, cwd=tmp_path)
    assert run.code == 2
    assert expected in assert_one_plain_line(run)
    assert fake_comfy.prompts == []  # nothing reached the GPU


async def test_a_prompt_past_the_operators_limit_is_refused_as_submit_refuses_it(
    fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    """``[limits] max_prompt_length`` binds `generate` too, in the chat's words."""
    config = tmp_path / "comfyveil.toml"
    config.write_text("[limits]\nmax_prompt_length = 40\n")
    prompt = "a fox " * 6 + "sleep"  # 41 characters
    run = await comfyveil(
        "generate", "f", prompt, "--server", fake_comfy.url, "--config", str(config),
        "--out", str(tmp_path / "out"), cwd=tmp_path,
    )
    assert run.code == 2
    line = assert_one_plain_line(run)
    assert line == "comfyveil: The prompt is 41 characters long; the limit is 40."
    assert fake_comfy.prompts == []  # nothing reached the GPU


async def test_missing_model_is_named_with_the_backend_and_exits_1(
    fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory(models={"diffusion_models": [], "text_encoders": [],
                                            "vae": [], "checkpoints": [], "loras": []})
    run = await comfyveil("generate", "f", "a fox", "--server", fake.url, cwd=tmp_path)
    assert run.code == 1
    line = assert_one_plain_line(run)
    assert "flux1-schnell.safetensors" in line and "not installed" in line


async def test_execution_error_on_the_gpu_exits_1_without_a_traceback(
    fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    fake_comfy.fail_next_execution("KSampler", message="CUDA out of memory")
    run = await comfyveil(
        "generate", "f", "a fox", "--set", "steps=1", "--server", fake_comfy.url, cwd=tmp_path
    )
    assert run.code == 1
    line = assert_one_plain_line(run)
    assert "KSampler" in line and "out of memory" in line


async def test_unreachable_server_exits_1(tmp_path: Path) -> None:
    # Bound but not listening, and held: refused, and no other process can take the port.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        run = await comfyveil("generate", "f", "a fox", "--server",
                              f"http://127.0.0.1:{port}", cwd=tmp_path)
    assert run.code == 1
    line = assert_one_plain_line(run)
    assert "cannot be reached" in line and f"http://127.0.0.1:{port}" in line  # which one


def _files(fake: FakeComfyUI) -> dict[str, list[str]]:
    return {kind: sorted(p.name for p in folder.rglob("*") if p.is_file())
            for kind, folder in fake.dirs.items()}


def _photo_with_exif(path: Path) -> None:
    exif = Image.Exif()
    exif[0x010F] = "PhoneMaker"  # camera make
    exif[0x8825] = {1: "N", 2: (48.0, 51.0, 24.0), 3: "E", 4: (2.0, 21.0, 3.0)}  # GPS
    Image.new("RGB", (96, 64), "blue").save(path, "JPEG", exif=exif.tobytes())


async def test_generate_leaves_nothing_on_the_gpu_host_and_no_metadata_in_the_files(
    fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    photo = tmp_path / "photo.jpg"
    _photo_with_exif(photo)
    run = await comfyveil(
        "generate", "qwen", "put a hat on it", "--image", str(photo), "--set", "steps=1",
        "--server", fake_comfy.url, "--out", str(tmp_path / "out"), cwd=tmp_path,
    )
    assert run.code == 0, run.stderr
    assert fake_comfy.history_entries == {}
    files = _files(fake_comfy)
    assert files["input"] == [] and files["output"] == []
    assert len(files["temp"]) == 2  # the upload and the result, now 1x1 images
    for left in files["temp"]:
        with Image.open(fake_comfy.dirs["temp"] / left) as placeholder:
            assert placeholder.size == (1, 1)
    (submitted,) = fake_comfy.prompts
    classes = {n["class_type"] for n in submitted["prompt"].values()}
    assert "PreviewImage" in classes and "SaveImage" not in classes
    uploaded = fake_comfy.uploads[0]
    assert uploaded["type"] == "temp"
    saved = Path(run.stdout.strip())
    with Image.open(saved) as image:
        assert not image.info.get("prompt") and not image.getexif()


async def test_generate_keep_metadata_keeps_the_prompt_in_the_file(
    fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    run = await comfyveil(
        "generate", "f", "a red fox", "--set", "steps=1", "--set", "width=256",
        "--set", "height=256", "--keep-metadata", "--server", fake_comfy.url,
        "--out", str(tmp_path / "out"), cwd=tmp_path,
    )
    assert run.code == 0, run.stderr
    with Image.open(Path(run.stdout.strip())) as image:
        assert "a red fox" in image.info["prompt"]
    # The file it came from (in temp/) was still overwritten and the history entry deleted.
    assert fake_comfy.history_entries == {}
    assert not list(fake_comfy.dirs["output"].rglob("*.png"))
    (written,) = (fake_comfy.dirs["temp"]).rglob("*.png")
    with Image.open(written) as placeholder:
        assert placeholder.size == (1, 1)


async def test_generate_with_no_trace_off_leaves_the_job_where_comfyui_puts_it(
    fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    config = tmp_path / "comfyveil.toml"
    config.write_text(
        f'[[backends]]\nname = "gpu0"\nurl = "{fake_comfy.url}"\nno_trace = false\n'
    )
    run = await comfyveil(
        "generate", "f", "a red fox", "--set", "steps=1", "--set", "width=256",
        "--set", "height=256", "--config", str(config), "--out", str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert run.code == 0, run.stderr
    assert len(fake_comfy.history_entries) == 1
    assert len(_files(fake_comfy)["output"]) == 1
    with Image.open(Path(run.stdout.strip())) as image:  # still stripped
        assert "prompt" not in image.info
