"""Dropping hidden metadata from image and video files without re-encoding them (pure).

What goes out to a GPU and what comes back to a user should carry pixels, not a story:
a phone's photo carries its camera, time and GPS position in EXIF; a ComfyUI PNG carries
the whole prompt and graph in `prompt` and `workflow` text chunks, an animated WebP the
same in EXIF, an MP4 in its container's `udta` box. Each function here walks the file's
container and leaves out those parts, byte for byte otherwise, so nothing is recompressed:

- PNG: only the chunks that draw the image are kept (image data, palette, transparency,
  colour: `iCCP`, `sRGB`, `gAMA`, `cHRM`, `cICP`, ...; animation frames). Text, `eXIf`,
  `tIME` and every private chunk go.
- JPEG: APP1 (EXIF, XMP), APP3-APP13, APP15 and comments go; JFIF (APP0), the ICC
  profile (APP2 `ICC_PROFILE`) and Adobe's colour transform (APP14) stay.
- WebP: the `EXIF` and `XMP ` chunks go (and their flags in `VP8X`); `ICCP` stays.
- MP4/MOV: every `udta` and `meta` box inside `moov` and its tracks becomes a `free` box
  of the same size, zero-filled, so no sample offset moves. Codec headers, track names
  given as handler names and the encoder string inside the video stream itself remain.

Anything else (GIF, WebM, audio) is returned unchanged: see `strippable`.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "strip",
    "strip_jpeg",
    "strip_mp4",
    "strip_path",
    "strip_png",
    "strip_webp",
    "strippable",
]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Chunks that draw the image (critical ones, colour and transparency, APNG frames).
_PNG_KEEP = frozenset(
    {
        b"IHDR",
        b"PLTE",
        b"IDAT",
        b"IEND",
        b"tRNS",
        b"gAMA",
        b"cHRM",
        b"sRGB",
        b"iCCP",
        b"sBIT",
        b"cICP",
        b"mDCv",
        b"cLLi",
        b"pHYs",
        b"bKGD",
        b"acTL",
        b"fcTL",
        b"fdAT",
    }
)
# JPEG markers without a length field.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
_MP4_CONTAINERS = frozenset({b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts"})
_MP4_METADATA = frozenset({b"udta", b"meta"})


class MetadataError(ValueError):
    """The file's container is damaged; it was left as it is."""


def strippable(data: bytes) -> bool:
    """Whether `strip` knows this file's container."""
    return _kind(data) is not None


def strip(data: bytes) -> bytes:
    """The file without its metadata, by its leading bytes; unknown files unchanged.

    A file whose container turns out damaged is returned unchanged too: the caller
    decides what a damaged file means (for a user's upload `images.check_image` has
    already decoded it).
    """
    kind = _kind(data)
    if kind is None:
        return data
    try:
        return _STRIPPERS[kind](data)
    except (MetadataError, struct.error):
        return data


def strip_path(path: Path) -> None:
    """Strip a file in place. An MP4 is blanked box by box without reading its media (a
    video may be large); any other file is read, stripped and replaced whole."""
    with path.open("rb") as handle:
        head = handle.read(16)
    if _kind(head) == "mp4":
        with path.open("r+b") as handle:
            try:
                _blank_file_boxes(handle, 0, path.stat().st_size)
            except (MetadataError, struct.error):
                pass  # a damaged container stays as it came
        return
    data = path.read_bytes()
    stripped = strip(data)
    if stripped != data:
        part = path.with_name(path.name + ".part")
        part.write_bytes(stripped)
        part.replace(path)


def _blank_file_boxes(handle: BinaryIO, start: int, end: int) -> None:
    """`_blank_boxes` on an open file: only box headers are read."""
    pos = start
    while pos + 8 <= end:
        handle.seek(pos)
        header = handle.read(16)
        (size,) = struct.unpack(">I", header[:4])
        kind = header[4:8]
        length = 8
        if size == 1:
            (size,) = struct.unpack(">Q", header[8:16])
            length = 16
        elif size == 0:
            size = end - pos
        if size < length or pos + size > end:
            raise MetadataError("an MP4 box is cut short")
        if kind in _MP4_METADATA:
            handle.seek(pos + 4)
            handle.write(b"free")
            handle.seek(pos + length)
            left = size - length
            while left > 0:
                chunk = min(left, 1 << 20)
                handle.write(bytes(chunk))
                left -= chunk
        elif kind in _MP4_CONTAINERS:
            _blank_file_boxes(handle, pos + length, pos + size)
        pos += size


def _kind(data: bytes) -> str | None:
    if data.startswith(PNG_SIGNATURE):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[4:8] == b"ftyp":
        return "mp4"
    return None


def strip_png(data: bytes) -> bytes:
    """A PNG without text, EXIF, time or private chunks."""
    if not data.startswith(PNG_SIGNATURE):
        raise MetadataError("not a PNG")
    out = [PNG_SIGNATURE]
    pos = len(PNG_SIGNATURE)
    while pos < len(data):
        if pos + 8 > len(data):
            raise MetadataError("a PNG chunk is cut short")
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if end > len(data):
            raise MetadataError("a PNG chunk is cut short")
        if kind in _PNG_KEEP:
            out.append(data[pos:end])
        pos = end
        if kind == b"IEND":
            break  # bytes after the end are someone's appendix, not the image
    return b"".join(out)


def strip_jpeg(data: bytes) -> bytes:
    """A JPEG without EXIF, XMP, IPTC or comments; JFIF, ICC and Adobe segments stay."""
    if not data.startswith(b"\xff\xd8"):
        raise MetadataError("not a JPEG")
    out = [b"\xff\xd8"]
    pos = 2
    while pos < len(data):
        if data[pos] != 0xFF:
            raise MetadataError("a JPEG marker is missing")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _JPEG_STANDALONE:
            out.append(data[pos : pos + 2])
            pos += 2
            continue
        if marker == 0xD9:  # end of image
            out.append(b"\xff\xd9")
            break
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        end = pos + 2 + length
        if length < 2 or end > len(data):
            raise MetadataError("a JPEG segment is cut short")
        if marker == 0xDA:  # start of scan: the rest is image data
            out.append(data[pos:])
            break
        if _keep_jpeg_segment(marker, data[pos + 4 : end]):
            out.append(data[pos:end])
        pos = end
    return b"".join(out)


def _keep_jpeg_segment(marker: int, payload: bytes) -> bool:
    if marker == 0xFE:  # comment
        return False
    if marker == 0xE0:
        return payload.startswith((b"JFIF\x00", b"JFXX\x00"))
    if marker == 0xE2:
        return payload.startswith(b"ICC_PROFILE\x00")  # not MPF's extra images
    if marker == 0xEE:
        return payload.startswith(b"Adobe")  # its transform flag changes the colours
    return not 0xE1 <= marker <= 0xEF  # every other APPn is metadata


def strip_webp(data: bytes) -> bytes:
    """A WebP without its EXIF and XMP chunks."""
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        raise MetadataError("not a WebP")
    (riff_size,) = struct.unpack("<I", data[4:8])
    end_of_file = min(len(data), 8 + riff_size)
    out: list[bytearray | bytes] = []
    pos = 12
    while pos + 8 <= end_of_file:
        kind = data[pos : pos + 4]
        (size,) = struct.unpack("<I", data[pos + 4 : pos + 8])
        end = pos + 8 + size + (size & 1)
        if pos + 8 + size > end_of_file:
            raise MetadataError("a WebP chunk is cut short")
        if kind == b"VP8X":
            header = bytearray(data[pos:end])
            header[8] &= ~0x0C & 0xFF  # no EXIF (0x08), no XMP (0x04)
            out.append(header)
        elif kind not in (b"EXIF", b"XMP "):
            out.append(data[pos:end])
        pos = end
    body = b"WEBP" + b"".join(out)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def strip_mp4(data: bytes) -> bytes:
    """An MP4/MOV whose `udta` and `meta` boxes (title, encoder, ComfyUI's prompt and
    workflow) are blanked into `free` boxes of the same size."""
    if data[4:8] != b"ftyp":
        raise MetadataError("not an MP4")
    out = bytearray(data)
    _blank_boxes(out, 0, len(out))
    return bytes(out)


def _blank_boxes(buf: bytearray, start: int, end: int) -> None:
    pos = start
    while pos + 8 <= end:
        (size,) = struct.unpack(">I", buf[pos : pos + 4])
        kind = bytes(buf[pos + 4 : pos + 8])
        header = 8
        if size == 1:
            if pos + 16 > end:
                raise MetadataError("an MP4 box is cut short")
            (size,) = struct.unpack(">Q", buf[pos + 8 : pos + 16])
            header = 16
        elif size == 0:
            size = end - pos  # to the end of the enclosing box
        if size < header or pos + size > end:
            raise MetadataError("an MP4 box is cut short")
        if kind in _MP4_METADATA:
            buf[pos + 4 : pos + 8] = b"free"
            buf[pos + header : pos + size] = bytes(size - header)
        elif kind in _MP4_CONTAINERS:
            _blank_boxes(buf, pos + header, pos + size)
        pos += size


_STRIPPERS = {"png": strip_png, "jpeg": strip_jpeg, "webp": strip_webp, "mp4": strip_mp4}
