"""A part of a multipart/form-data body (the images API's edits, the jobs API's uploads),
read up to a limit and never past it."""

from __future__ import annotations

from aiohttp import BodyPartReader

from comfyveil.api.errors import ApiError
from comfyveil.i18n import _

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
