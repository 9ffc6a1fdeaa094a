"""Every example the README and the docs mark runnable runs, as a reader would paste it,
against the fake ComfyUI: a shell block with bash, a Python block with this Python.

A block is runnable when the line before its opening fence is `<!-- runnable -->`. The
reader's checkout is stood in for by a folder with `.venv/bin/comfyveil` and a
comfyveil.toml naming the fake as the backend."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.api.test_api_openai import make_key
from tests.fakes.comfyui import FakeComfyUI
from tests.web.support import client, sign_up, web_stack

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- runnable -->"


@dataclass(frozen=True)
class Example:
    where: str  # file:line, the test's id
    language: str  # sh or python
    code: str


def runnable_examples() -> list[Example]:
    pages = [ROOT / "README.md"] + [
        p for p in sorted((ROOT / "docs").rglob("*.md")) if "pending" not in p.parts
    ]
    found = []
    for page in pages:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != MARK:
                continue
            fence = re.match(r"\s*```(sh|bash|python)\s*$", lines[i + 1])
            assert fence, f"{page.name}:{i + 1}: {MARK} must come right before a sh or python fence"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            found.append(
                Example(
                    f"{page.relative_to(ROOT)}:{i + 2}",
                    "python" if fence.group(1) == "python" else "sh",
                    "\n".join(lines[i + 2 : end]) + "\n",
                )
            )
    return found


EXAMPLES = runnable_examples()
SHELL = [e for e in EXAMPLES if e.language == "sh"]
PYTHON = [e for e in EXAMPLES if e.language == "python"]


def test_the_quick_start_chain_is_marked_runnable() -> None:
    readme = [e for e in EXAMPLES if e.where.startswith("README.md")]
    assert any("generate f" in e.code and "--image" in e.code for e in readme)


def _checkout(tmp_path: Path, fake_comfy: FakeComfyUI) -> tuple[Path, dict[str, str]]:
    """A reader's checkout (`.venv/bin/comfyveil`, a comfyveil.toml naming the fake) and
    the environment to run an example in."""
    checkout = tmp_path / "checkout"
    bin_dir = checkout / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    shim = bin_dir / "comfyveil"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m comfyveil "$@"\n')
    shim.chmod(0o755)
    (checkout / "comfyveil.toml").write_text(
        f'[[backends]]\nname = "gpu0"\nurl = "{fake_comfy.url}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYVEIL_")}
    env |= {
        "COMFYVEIL_DATA_DIR": str(tmp_path / "data"),
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    return checkout, env


async def _run(example: Example, command: list[str], cwd: Path, env: dict[str, str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, f"{example.where}\n{out.decode()}\n{err.decode()}"
    assert "Traceback" not in err.decode()


@pytest.mark.parametrize("example", SHELL, ids=[e.where for e in SHELL])
async def test_a_runnable_shell_example_runs(
    example: Example, fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    checkout, env = _checkout(tmp_path, fake_comfy)
    await _run(example, ["bash", "-euo", "pipefail", "-c", example.code], checkout, env)
    if "generate" in example.code:
        # What the reader was promised: one image per generate, each edit fed the previous.
        made = sorted((checkout / "out").rglob("*.png"))
        assert len(made) == example.code.count("comfyveil generate"), made
        uploads = [u for u in fake_comfy.uploads if u.get("size", 0) > 100]
        assert len(uploads) == example.code.count("--image")


@pytest.mark.parametrize("example", PYTHON, ids=[e.where for e in PYTHON])
async def test_a_runnable_python_example_runs_against_the_images_api(
    example: Example, db: Any, fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
    """Python examples talk to the images API: they run with the test server's address
    and a key its settings page made in place of the example's own, as a reader would
    put theirs."""
    checkout, env = _checkout(tmp_path, fake_comfy)
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "reader")
        key = await make_key(session, stack.url)
        code = example.code.replace("http://127.0.0.1:8080", stack.url).replace(
            '"cv-..."', f'"{key}"'
        )
        assert code != example.code, "the example names the API's address and a key"
        await _run(example, [sys.executable, "-c", code], checkout, env)
    if "images.generate" in example.code:
        made = sorted(checkout.glob("*.png"))
        assert made, "the example saves the image it was sent"
        for path in made:
            with Image.open(path) as image:
                assert image.format == "PNG"
