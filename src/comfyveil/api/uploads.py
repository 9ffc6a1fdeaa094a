"""What a client uploads to the API (the images API's edits, the jobs API's inputs): a
part of a multipart/form-data body, read up to a limit and never past it, and an image,
checked against the operator's limits."""

from __future__ import annotations

import asyncio

from aiohttp import BodyPartReader

from comfyveil import config, errors, images
from comfyveil.api.errors import ApiError, from_usage
from comfyveil.i18n import _
from comfyveil.images import MIMES
from comfyveil.store import jobs

CHUNK = 64 * 1024


async def read_part(part: BodyPartReader, limit: int, *, param: str) -> bytes:
    """The part's body.

    Raises:
        ApiError: 413 past `limit` bytes (read no further), naming `param`.
    """
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk(CHUNK):
        size += len(chunk)
        if size > limit:
            raise ApiError(413, _("That upload is too large."), param=param)
        chunks.append(chunk)
    return b"".join(chunks)


async def input_image(
    data: bytes, limits: config.LimitsConfig, *, param: str | None = None
) -> jobs.InputImage:
    """`data` as a job's input image, checked against `[limits]` (in a thread: decoding
    takes a while); named ``api.EXT``, as nothing of the client's file name is kept.

    Raises:
        ApiError: not an image, or past a limit: the desk's sentence, naming `param`.
    """
    try:
        checked = await asyncio.to_thread(
            images.check_image,
            data,
            max_bytes=limits.max_image_bytes,
            max_pixels=limits.max_image_pixels,
        )
    except errors.UsageError as exc:
        problem = from_usage(exc)
        if param is not None:
            problem.param = param
        raise problem from None
    return jobs.InputImage(
        filename=f"api.{MIMES[checked.mime]}", mime=checked.mime, data=checked.data
    )
