"""``stream=true``: the answer as Server-Sent Events, in the shapes OpenAI's SDK reads
into its ``ImageGenStreamEvent`` / ``ImageEditStreamEvent``: a ``*.completed`` event per
image (``image_generation.*`` for a generation, ``image_edit.*`` for an edit), or an
``error`` event carrying OpenAI's error object, which the SDK raises. With
``partial_images`` (1-3), the sampler's previews come first as ``*.partial_image`` events,
as many as the backend sends up to that number (the workers write a job's newest preview
frame to the database when its client asked: store/previews.py); a backend that sends no
previews gives the completed event alone."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
import uuid
from typing import Any, Protocol

from aiohttp import web
from PIL import Image

from comfyveil import metadata
from comfyveil.api.errors import ApiError
from comfyveil.api.formats import MIME_FORMATS
from comfyveil.store import errors as store_errors
from comfyveil.store import previews as previews_mod

logger = logging.getLogger(__name__)

PREVIEW_POLL = 0.2  # seconds between looks for a newer preview while a stream waits


class Shaped(Protocol):
    output_format: str | None
    quality: str
    background: str
    partials: int


# OpenAI bills tokens; a self-hosted GPU does not, so every count is 0
USAGE = {
    "input_tokens": 0,
    "input_tokens_details": {"image_tokens": 0, "text_tokens": 0},
    "output_tokens": 0,
    "total_tokens": 0,
}


class Answer:
    def __init__(self, request: web.Request, shape: Shaped, *, edit: bool) -> None:
        self.request = request
        self.shape = shape
        self.prefix = "image_edit" if edit else "image_generation"
        self.response: web.StreamResponse | None = None
        self._following: asyncio.Task[None] | None = None
        self._followed: tuple[previews_mod.PreviewStore, list[uuid.UUID]] | None = None

    async def open(self) -> None:
        """Send the headers: the client knows at once that events will come."""
        self.response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # a proxy in front must not hold the events
            }
        )
        await self.response.prepare(self.request)

    async def follow(self, store: previews_mod.PreviewStore, job_ids: list[uuid.UUID]) -> None:
        """Ask for the jobs' previews and send each newer one as a partial image, up to
        `partials` a job, until the results are sent."""
        try:
            await store.want(job_ids)
        except store_errors.StoreError:
            return  # no previews: the completed events still come
        self._following = asyncio.create_task(self._follow(store, job_ids), name="api-previews")
        self._followed = (store, job_ids)

    async def _follow(self, store: previews_mod.PreviewStore, job_ids: list[uuid.UUID]) -> None:
        seen = dict.fromkeys(job_ids, 0)
        sent = dict.fromkeys(job_ids, 0)
        index = 0
        while any(n < self.shape.partials for n in sent.values()):
            await asyncio.sleep(PREVIEW_POLL)
            for job_id in job_ids:
                if sent[job_id] >= self.shape.partials:
                    continue
                try:
                    found = await store.newer(job_id, seen[job_id])
                except store_errors.StoreError:
                    continue
                if found is None:
                    continue
                seen[job_id] = found.seq
                try:
                    image = metadata.strip(found.data)
                    size, kind = _described(image)
                except (OSError, ValueError, SyntaxError):
                    continue  # a frame Pillow cannot read is not shown
                await self._event(
                    f"{self.prefix}.partial_image",
                    {
                        "type": f"{self.prefix}.partial_image",
                        "b64_json": base64.b64encode(image).decode("ascii"),
                        "created_at": int(time.time()),
                        "size": size,
                        "quality": self.shape.quality,
                        "background": self.shape.background,
                        "output_format": kind,
                        "partial_image_index": index,
                    },
                )
                sent[job_id] += 1
                index += 1

    async def stop(self) -> None:
        task, self._following = self._following, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        followed, self._followed = self._followed, None
        if followed is not None:
            store, job_ids = followed
            try:
                await store.drop(job_ids)
            except store_errors.StoreError:
                pass  # the rows go with their jobs anyway

    async def ping(self) -> None:
        """A comment line: ignored by every SSE reader, it shows the stream is alive."""
        assert self.response is not None
        await self.response.write(b": keep-alive\n\n")

    async def _event(self, name: str, data: dict[str, Any]) -> None:
        assert self.response is not None
        await self.response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())

    async def completed(self, results: list[dict[str, Any]]) -> web.StreamResponse:
        assert self.response is not None
        await self.stop()
        for item in results:
            encoded = item["b64_json"]
            size, kind = _described(base64.b64decode(encoded))
            await self._event(
                f"{self.prefix}.completed",
                {
                    "type": f"{self.prefix}.completed",
                    "b64_json": encoded,
                    "created_at": int(time.time()),
                    "size": size,
                    "quality": self.shape.quality,
                    "background": self.shape.background,
                    "output_format": kind,
                    "usage": USAGE,
                },
            )
        await self.response.write_eof()
        return self.response

    async def error(self, problem: ApiError) -> web.StreamResponse:
        assert self.response is not None
        await self.stop()
        body = {
            "message": problem.message,
            "type": problem.type,
            "param": problem.param,
            "code": problem.code,
        }
        await self._event("error", {"type": "error", "error": body})
        await self.response.write_eof()
        return self.response


def _described(data: bytes) -> tuple[str, str]:
    """The image's "WxH" and format name, from its header."""
    with Image.open(io.BytesIO(data)) as image:
        kind = MIME_FORMATS.get(Image.MIME.get(image.format or "", ""), "png")
        return f"{image.width}x{image.height}", kind
