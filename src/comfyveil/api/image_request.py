"""The body of ``POST /v1/images/generations`` and ``/v1/images/edits`` read as OpenAI's
SDK sends it (JSON, or multipart/form-data with the images), each read with a size bound,
and its fields checked: the number of images, the size, and how the answer is shaped. A
digest of the request is taken as it is read, for a retry to find its first try's jobs.
The prompt and images are never logged."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from comfyveil.api import formats, retries
from comfyveil.api.context import ACCOUNT, ApiServices, services
from comfyveil.api.errors import ApiError, bad_request
from comfyveil.api.uploads import input_image, read_part
from comfyveil.desk import registry
from comfyveil.i18n import _
from comfyveil.store import jobs

MAX_N = 10  # OpenAI's own bound on n

MAX_JSON = 256 * 1024  # a generation request: the prompt and a few fields
MAX_FIELD = 64 * 1024  # a text field of an edit request
MAX_PARTS = 16  # fields and images of one edit request
MAX_IMAGES = 4  # images of one edit request (no shipped command takes more than one)
SIZE = re.compile(r"^\s*(\d{1,5})\s*x\s*(\d{1,5})\s*$")
FORMATS = ("b64_json", "url")
IDEMPOTENCY = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


@dataclass
class Ask:
    """One request, read."""

    model: str = ""
    prompt: str | None = None
    n: Any = 1
    size: Any = None
    response_format: Any = None
    output_format: Any = None
    output_compression: Any = None
    stream: Any = False
    quality: Any = None
    background: Any = None
    partial_images: Any = None
    images: list[jobs.InputImage] = field(default_factory=list)
    mask: bool = False
    # a digest of the whole request, for a retry to find the jobs of its first try
    fingerprint: retries.Fingerprint | None = None

    def take(self, name: str, value: Any) -> None:
        """A field of the request: the ones that change the answer are kept; `style`,
        `moderation`, `user`, `safety_identifier` and any other are
        accepted and left aside (documented), never stored."""
        if name == "model":
            self.model = value if isinstance(value, str) else ""
        elif name == "prompt":
            self.prompt = value if isinstance(value, str) else None
        elif name in KEPT:
            setattr(self, name, value)


KEPT = (
    "n",
    "size",
    "response_format",
    "output_format",
    "output_compression",
    "stream",
    "quality",
    "background",
    "partial_images",
)


def fingerprint(request: web.Request, route: str) -> retries.Fingerprint | None:
    """None for a request with its own Idempotency-Key (the key says what a retry is)."""
    if IDEMPOTENCY.match(request.headers.get("Idempotency-Key", "")):
        return None
    return retries.Fingerprint(route, request[ACCOUNT].id, services(request).link_secret)


async def _json_body(request: web.Request, limit: int) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, _("That upload is too large."))
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):  # a read may return less
        size += len(chunk)
        if size > limit:
            raise ApiError(413, _("That upload is too large."))
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):  # "[[[[..." nested past Python's stack
        raise bad_request(_("The request's body is not JSON.")) from None
    if not isinstance(body, dict):
        raise bad_request(_("The request's body is not JSON."))
    return body


def _from_json(body: dict[str, Any], fingerprint: retries.Fingerprint | None) -> Ask:
    ask = Ask(fingerprint=fingerprint)
    for name, value in body.items():
        ask.take(name, value)
    if fingerprint is not None:
        fingerprint.add("json", json.dumps(body, sort_keys=True).encode())
    return ask


async def read_generation(request: web.Request) -> Ask:
    """A generation request: JSON only."""
    body = await _json_body(request, MAX_JSON)
    return _from_json(body, fingerprint(request, "generations"))


async def read_edit(request: web.Request, svc: ApiServices) -> Ask:
    """An edit request: JSON with its images as data URLs, or multipart/form-data."""
    limits = svc.settings.limits
    if request.content_type == "application/json":
        # the JSON form: images as data URLs ("image", "image[]" or "images":
        # [{"image_url": ...}]), as OpenAI's newer clients send them
        body = await _json_body(request, MAX_JSON + MAX_IMAGES * limits.max_image_bytes * 4 // 3)
        ask = _from_json(body, fingerprint(request, "edits"))
        for name in ("image", "image[]", "images"):
            for item in _listed(body.get(name)):
                url = item.get("image_url") if isinstance(item, dict) else item
                await _add_image(ask, _data_url(url), svc)
        if body.get("mask") is not None:
            ask.mask = True
        return ask
    return await _from_multipart(request, svc)


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _data_url(value: Any) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL (a web address is not fetched: the
    server never reaches out to where a client points it)."""
    text = value if isinstance(value, str) else ""
    head, comma, payload = text.partition(",")
    if not comma or not head.startswith("data:") or not head.endswith(";base64"):
        raise bad_request(_("Send each image as a file or as a data: URL."), param="image")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError:
        raise bad_request(
            _("Send each image as a file or as a data: URL."), param="image"
        ) from None


async def _add_image(ask: Ask, data: bytes, svc: ApiServices) -> None:
    if len(ask.images) >= MAX_IMAGES:
        raise bad_request(_("That request has too many parts."), param="image")
    image = await input_image(data, svc.settings.limits)
    if ask.fingerprint is not None:
        ask.fingerprint.add("image", data)
    ask.images.append(image)


async def _from_multipart(request: web.Request, svc: ApiServices) -> Ask:
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError):
        raise bad_request(_("Send the edit as multipart/form-data.")) from None
    ask = Ask(fingerprint=fingerprint(request, "edits"))
    limits = svc.settings.limits
    for _i in range(MAX_PARTS + 1):
        part = await reader.next()
        if part is None:
            break
        if not isinstance(part, BodyPartReader):
            raise bad_request(_("Send the edit as multipart/form-data."))
        name = (part.name or "").removesuffix("[]")
        if name in ("image", "mask"):
            data = await read_part(part, limits.max_image_bytes, param=name)
            if name == "mask":
                ask.mask = True
                continue
            await _add_image(ask, data, svc)
            continue
        raw = await read_part(part, MAX_FIELD, param=name)
        if ask.fingerprint is not None:
            ask.fingerprint.add(name, raw)
        text = raw.decode("utf-8", "replace")
        ask.take(name, text)
    else:
        raise bad_request(_("That request has too many parts."))
    return ask


def count(value: Any) -> int:
    try:
        n = int(value) if not isinstance(value, bool) else -1
    except (TypeError, ValueError, OverflowError):  # 1e400 is JSON's infinity
        n = -1
    if isinstance(value, float) and not value.is_integer():
        n = -1
    if not 1 <= n <= MAX_N:
        raise bad_request(
            _("The number of images (n) is from 1 to {n}.").format(n=MAX_N), param="n"
        )
    return n


def size_values(entry: registry.Entry, value: Any) -> dict[str, object]:
    """The workflow's width and height for `size` ("WxH"); none when it has no such
    options or the client leaves the size to us."""
    if value is None or value == "" or value == "auto":
        return {}
    found = SIZE.match(value) if isinstance(value, str) else None
    if found is None:
        raise bad_request(
            _("The size is the image's width and height in pixels, such as 1024x1024."),
            param="size",
        )
    params = entry.workflow.params
    if "width" not in params or "height" not in params:
        return {}
    return {"width": int(found.group(1)), "height": int(found.group(2))}


def _flag(value: Any) -> bool:
    """`stream` as JSON (true) or a form field ("true")."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return value is True


@dataclass(frozen=True)
class Shape:
    """How the results are answered."""

    response_format: str  # b64_json or url
    output_format: str | None  # png, jpeg, webp; None: as the workflow saved it
    compression: int | None
    stream: bool
    quality: str
    background: str
    partials: int  # sampler previews to stream before each image (OpenAI's 0-3)


def shape(ask: Ask) -> Shape:
    response_format = ask.response_format or "b64_json"
    if response_format not in FORMATS:
        raise bad_request(_("The response_format is b64_json or url."), param="response_format")
    output_format = ask.output_format or None
    if output_format is not None:
        output_format = str(output_format).strip().lower()
        if output_format not in formats.FORMATS:
            raise bad_request(_("The output_format is png, jpeg or webp."), param="output_format")
    compression = ask.output_compression
    if compression is not None and compression != "":
        try:
            compression = int(compression) if not isinstance(compression, bool) else -1
        except (TypeError, ValueError):
            compression = -1
        if not 0 <= compression <= 100:
            raise bad_request(
                _("The output_compression is a whole number from 0 to 100."),
                param="output_compression",
            )
    else:
        compression = None
    quality = ask.quality if ask.quality in QUALITIES else "auto"
    # no workflow draws a transparent background: the answer says "opaque", as it is
    background = "opaque" if ask.background in ("transparent", "opaque") else "auto"
    stream = _flag(ask.stream)
    try:
        partials = min(max(int(ask.partial_images or 0), 0), MAX_PARTIALS) if stream else 0
    except (TypeError, ValueError):
        partials = 0
    return Shape(response_format, output_format, compression, stream, quality, background, partials)


MAX_PARTIALS = 3  # OpenAI's bound on partial_images
QUALITIES = ("low", "medium", "high", "xhigh", "max", "auto")
