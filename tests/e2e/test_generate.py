"""`comfyveil generate` as a user runs it: a subprocess against the fake ComfyUI."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from tests.fakes.comfyui import FakeComfyUI


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str


async def comfyveil(*args: str, cwd: Path) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYVEIL_")}
    env["COMFYVEIL_DATA_DIR"] = str(cwd / "data")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "comfyveil", *args,
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
    graph = submitted["prompt"]
    texts = [n["inputs"].get("clip_l") for n in graph.values() if "clip_l" in n["inputs"]]
    assert texts == ["an astronaut"]
    assert all(n["inputs"].get("steps", 2) == 2 for n in graph.values())


async def test_edit_workflow_uploads_the_image_under_a_content_name(
    fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    photo = tmp_path / "my holiday photo.png"
    photo.write_bytes(png(96, 64))
    run = await comfyveil(
        "generate", "qwen", "put a hat on it", "--image", str(photo), "--set", "steps=1",
        "--server", fake_comfy.url, "--out", str(tmp_path / "out"), cwd=tmp_path,
    )
    assert run.code == 0, run.stderr
    (upload,) = fake_comfy.uploads
    assert "holiday" not in str(upload)  # the user's file name never reaches the GPU host
    (submitted,) = fake_comfy.prompts
    loads = [n for n in submitted["prompt"].values() if n["class_type"] == "LoadImage"]
    assert loads and loads[0]["inputs"]["image"].startswith("comfyveil-")
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
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    run = await comfyveil("generate", "f", "a fox", "--server", f"http://127.0.0.1:{port}",
                          cwd=tmp_path)
    assert run.code == 1
    assert "cannot be reached" in assert_one_plain_line(run)
