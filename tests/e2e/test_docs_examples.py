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

import pytest

from tests.fakes.comfyui import FakeComfyUI

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


def test_the_quick_start_chain_is_marked_runnable() -> None:
    readme = [e for e in EXAMPLES if e.where.startswith("README.md")]
    assert any("generate f" in e.code and "--image" in e.code for e in readme)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.where for e in EXAMPLES])
async def test_a_runnable_example_runs(
    example: Example, fake_comfy: FakeComfyUI, tmp_path: Path
) -> None:
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
    command = (
        ["bash", "-euo", "pipefail", "-c", example.code]
        if example.language == "sh"
        else [sys.executable, "-c", example.code]
    )
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=checkout,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, f"{example.where}\n{out.decode()}\n{err.decode()}"
    assert "Traceback" not in err.decode()
    if "generate" in example.code:
        # What the reader was promised: one image per generate, each edit fed the previous.
        made = sorted((checkout / "out").rglob("*.png"))
        assert len(made) == example.code.count("comfyveil generate"), made
        uploads = [u for u in fake_comfy.uploads if u.get("size", 0) > 100]
        assert len(uploads) == example.code.count("--image")
