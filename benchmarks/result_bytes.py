"""What one result of each shipped command costs in bytes over the link to the GPU host.

    .venv/bin/python benchmarks/result_bytes.py

A result is fetched once, as ComfyUI wrote it: for an image command, SaveImage's PNG
(Pillow, compress_level 4, the prompt's graph as a text chunk) at the size the
command's graph makes by default. The pixels stand in for a generated picture: octaves
of noise whose contrast falls with their size (a photo's spectrum), at three levels of
fine detail: smooth (a soft render), medium, detailed (a busy photo). The comparison is
the same image as the 1-megapixel JPEG a web page would serve (quality 90): what the
PNG costs against a lossy copy. No GPU and no network: Pillow only.

The video command (Wan 2.2) writes H.264 through PyAV, which this project does not
install: its row gives only the frames' pixels.
Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import io
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from PIL import PngImagePlugin

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.photos import textured  # noqa: E402

from comfyveil.comfy import template, workflow  # noqa: E402

DETAIL = {"smooth": 0.6, "medium": 0.7, "detailed": 0.8}  # contrast kept per octave
SEEDS = (1, 2)


def output_size(wf: workflow.Workflow) -> tuple[int, int, int] | None:
    """(width, height, frames) of the command's default result, from its graph."""
    for node in wf.graph.values():
        inputs = node.get("inputs", {})
        kind = node.get("class_type", "")
        if kind in ("EmptySD3LatentImage", "EmptyLatentImage"):
            return int(inputs["width"]), int(inputs["height"]), 1
        if kind == "EmptyHunyuanLatentVideo":
            return int(inputs["width"]), int(inputs["height"]), int(inputs["length"])
        if kind == "ImageScaleToTotalPixels":
            side = round((float(inputs["megapixels"]) * 1024 * 1024) ** 0.5)
            return side, side, 1  # an edit: the input's aspect at that many pixels
    return None


def comfy_png(wf: workflow.Workflow, roughness: float, seed: int, size: tuple[int, int]) -> int:
    """Bytes of the PNG ComfyUI's SaveImage writes for a picture of `size`."""
    info = PngImagePlugin.PngInfo()
    info.add_text("prompt", json.dumps(template.thaw(wf.graph)))
    out = io.BytesIO()
    textured(*size, seed=seed, rough=roughness).save(out, "PNG", pnginfo=info, compress_level=4)
    return len(out.getvalue())


def jpeg_bytes(roughness: float, seed: int, size: tuple[int, int]) -> int:
    out = io.BytesIO()
    textured(*size, seed=seed, rough=roughness).save(out, "JPEG", quality=90)
    return len(out.getvalue())


def main() -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for wf in sorted(workflow.shipped().values(), key=lambda w: w.command):
        size = output_size(wf)
        if size is None:
            continue
        width, height, frames = size
        row: dict[str, Any] = {"width": width, "height": height, "frames": frames}
        if frames == 1:
            for name, roughness in DETAIL.items():
                row[name] = statistics.median(
                    comfy_png(wf, roughness, s, (width, height)) for s in SEEDS
                )
            row["jpeg_q90_medium"] = statistics.median(
                jpeg_bytes(DETAIL["medium"], s, (width, height)) for s in SEEDS
            )
        rows[f"/{wf.command}"] = row
    return rows


def table(rows: dict[str, Any]) -> str:
    head = f"{'command':8} {'size':>14} {'smooth':>9} {'medium':>9} {'detailed':>9} {'jpeg90':>9}"
    lines = [head + "   (MB, the PNG ComfyUI writes; jpeg90: the same, lossy)"]
    for command, row in rows.items():
        size = f"{row['width']}x{row['height']}"
        if row["frames"] > 1:
            size += f"x{row['frames']}"
            lines.append(f"{command:8} {size:>14}   H.264 by PyAV: not measured here")
            continue
        figures = [row[k] / 1e6 for k in ("smooth", "medium", "detailed", "jpeg_q90_medium")]
        lines.append(f"{command:8} {size:>14} " + " ".join(f"{v:9.2f}" for v in figures))
    return "\n".join(lines)


if __name__ == "__main__":
    figures = main()
    print(table(figures))
    print(json.dumps(figures))
