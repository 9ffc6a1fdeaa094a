"""``stream=true``: the answer as Server-Sent Events, in the shapes OpenAI's SDK reads
into its ``ImageGenStreamEvent`` / ``ImageEditStreamEvent``: a ``*.completed`` event per
image (``image_generation.*`` for a generation, ``image_edit.*`` for an edit), or an
``error`` event carrying OpenAI's error object, which the SDK raises. Partial images are
not sent: the workers do not pass the backends' sampler previews on to the API, so every
stream is what OpenAI sends for ``partial_images = 0``."""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any, Protocol

from aiohttp import web
from PIL import Image

from comfyveil.api.errors import ApiError
from comfyveil.api.formats import MIME_FORMATS


class Shaped(Protocol):
    output_format: str | None
    quality: str
    background: str


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

    async def ping(self) -> None:
        """A comment line: ignored by every SSE reader, it shows the stream is alive."""
        assert self.response is not None
        await self.response.write(b": keep-alive\n\n")

    async def _event(self, name: str, data: dict[str, Any]) -> None:
        assert self.response is not None
        await self.response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())

    async def completed(self, results: list[dict[str, Any]]) -> web.StreamResponse:
        assert self.response is not None
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
