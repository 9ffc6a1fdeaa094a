"""A job's input images on their way to a backend: named by their content, never the
user's file name (the backend learns nothing from it, and the same image sent twice is
stored once: ComfyUI deduplicates by name and hash), or with `no_trace` put in the
backend's temp folder under a random name with their metadata off. An input larger than
the workflow can use is scaled down to that size before it is sent (`fit_inputs`): over a
slow link a job's time is its bytes."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from comfyveil import metadata
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import fit, notrace, shrink, workflow

_MIME_EXT = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp", "image/gif": ".gif"}
_STRIP_IN_THREAD = 1 << 20  # bytes: a bigger output is stripped off the event loop


@dataclass(frozen=True, slots=True)
class InputImage:
    """An image to upload for one of the workflow's image parameters."""

    data: bytes = field(repr=False)
    mime: str = "image/png"

    @property
    def upload_name(self) -> str:
        digest = hashlib.sha256(self.data).hexdigest()[:24]
        return f"comfyveil-{digest}{_MIME_EXT.get(self.mime, '.png')}"


async def fit_inputs(
    wf: workflow.Workflow,
    values: Mapping[str, object],
    inputs: Mapping[str, InputImage],
    max_pixels: int,
) -> dict[str, InputImage]:
    """Each input at the largest size `wf` can use it at with these `values`, in the
    fewest bytes that change nothing it sees (`comfy.fit`, `comfy.shrink`); the caller's
    images (the user's originals, kept for a re-roll) are not changed."""
    graph = wf.apply({k: v for k, v in values.items() if k not in inputs})
    fitted: dict[str, InputImage] = {}
    for param, image in inputs.items():
        found = wf.params.get(param)
        need = fit.fit_for(graph, found) if found is not None else fit.Fit()
        smaller = await shrink.shrink_async(image.data, need, max_pixels=max_pixels)
        fitted[param] = image if smaller is None else InputImage(smaller.data, smaller.mime)
    return fitted


async def upload_inputs(
    client: comfy_client.ComfyClient,
    inputs: Mapping[str, InputImage],
    *,
    on_sent: Callable[[int], None] | None = None,
) -> dict[str, str]:
    """Upload each input image; returns parameter name -> the name to put in the graph."""
    names: dict[str, str] = {}
    for param, image in inputs.items():
        uploaded = await client.upload_image(image.data, image.upload_name, on_sent=on_sent)
        names[param] = uploaded.reference
    return names


async def upload_traceless(
    client: comfy_client.ComfyClient,
    inputs: Mapping[str, InputImage],
    names: Mapping[str, notrace.Trace],
    *,
    on_sent: Callable[[int], None] | None = None,
) -> dict[str, str]:
    """Upload each input into the backend's temp folder under its trace's name."""
    refs: dict[str, str] = {}
    for param, image in inputs.items():
        trace = names[param]
        data = await stripped(image.data)
        await client.upload_image(data, trace.name, type=trace.folder, on_sent=on_sent)
        refs[param] = trace.reference
    return refs


async def stripped(data: bytes) -> bytes:
    """`data` without its metadata; a big file is stripped off the event loop."""
    if len(data) > _STRIP_IN_THREAD:
        return await asyncio.to_thread(metadata.strip, data)
    return metadata.strip(data)
