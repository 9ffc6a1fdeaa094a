"""Dropping hidden metadata from image and video files without re-encoding them (pure).

What goes out to a GPU and what comes back to a user should carry pixels, not a story:
a phone's photo carries its camera, time and GPS position in EXIF; a ComfyUI PNG carries
the whole prompt and graph in `prompt` and `workflow` text chunks, an animated WebP the
same in EXIF, an MP4 in its container's `udta` box. Each function here walks the file's
container and leaves out those parts, byte for byte otherwise, so nothing is recompressed:

- PNG: only the chunks that draw the image are kept (image data, palette, transparency,
  colour: `iCCP`, `sRGB`, `gAMA`, `cHRM`, `cICP`, ...; animation frames). Text, `eXIf`,
  `tIME` and every private chunk go, and so does anything after `IEND`.
- JPEG: APP1 (EXIF, XMP), APP3-APP13, APP15 and comments go; JFIF (APP0), the ICC
  profile (APP2 `ICC_PROFILE`) and Adobe's colour transform (APP14) stay. The file ends
  at the EOI after the last scan: appended images (MPF, gain maps), motion-photo videos
  and maker trailers go, and so does every APPn or comment between progressive scans.
- WebP: the `EXIF` and `XMP ` chunks go (and their flags in `VP8X`); `ICCP` stays.
- MP4/MOV: every `udta`, `meta` and `uuid` box (XMP lives in a top-level `uuid`) at the
  top level, inside `moov` and its tracks and inside `moof`/`traf` fragments becomes a
  `free` box of the same size, zero-filled, so no sample offset moves. Codec headers,
  track names given as handler names and the encoder string inside the video stream
  itself remain.
- ICC profiles (PNG, JPEG, WebP) keep their colour data; their free-text tags
  (description, copyright, device names, dictionaries, calibration date) are zero-filled
  in place and the profile ID is cleared, so no size or offset changes.

Parsing is iterative and bounded (boxes, depth, segments): a crafted file costs a bounded
amount of work and raises `MetadataError`, never IndexError or RecursionError.
Anything else (GIF, WebM, audio) is returned unchanged: see `strippable`.
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "MetadataError",
    "strip",
    "strip_icc",
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
_MP4_CONTAINERS = frozenset(
    {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts", b"moof", b"traf"}
)
_MP4_METADATA = frozenset({b"udta", b"meta", b"uuid"})
# Far above any real file (a long fragmented video has some thousands of boxes, nested
# six deep); a crafted one stops here instead of costing unbounded time or stack.
_MP4_MAX_BOXES = 1_000_000
_MP4_MAX_DEPTH = 16
# Markers allowed between two progressive scans: tables, restart interval, line count.
_JPEG_BETWEEN_SCANS = frozenset({0xC4, 0xCC, 0xDB, 0xDC, 0xDD})
# After a scan's header: the next 0xFF that is not stuffing (00), a restart (D0-D7) or a
# fill byte starts a marker.
_JPEG_NEXT_MARKER = re.compile(rb"\xff+([^\x00\xd0-\xd7\xff])")
# Type signatures of ICC tags that hold free text (or a date): blanked, colour stays.
_ICC_TEXT_TYPES = frozenset(
    {b"desc", b"mluc", b"text", b"dict", b"dtim", b"utf8", b"ut16", b"zut8"}
)
_ICC_MAX_BYTES = 4 * 1024 * 1024  # a real profile is some KB; a bigger iCCP is a bomb
_ICC_MAX_TAGS = 1000


class MetadataError(ValueError):
    """The file's container is damaged or crafted; nothing of it should be used."""


def strippable(data: bytes) -> bool:
    """Whether `strip` knows this file's container."""
    return _kind(data) is not None


def strip(data: bytes) -> bytes:
    """The file without its metadata, by its leading bytes; unknown files unchanged.

    Raises:
        MetadataError: the container is damaged (cut short, a length that points past
            its end, a crafted nesting). Its metadata cannot be told from its pixels, so
            it is not to be passed on as it is.
    """
    kind = _kind(data)
    if kind is None:
        return data
    try:
        return _STRIPPERS[kind](data)
    except (struct.error, IndexError, zlib.error) as exc:  # a bound we missed: same answer
        raise MetadataError("the file's container is damaged") from exc


def strip_path(path: Path) -> None:
    """Strip a file in place. An MP4 is blanked box by box without reading its media (a
    video may be large); any other file is read, stripped and replaced whole.

    Raises:
        MetadataError: as `strip`; the file may then be partly blanked.
    """
    with path.open("rb") as handle:
        head = handle.read(16)
    if _kind(head) == "mp4":
        with path.open("r+b") as handle:
            try:
                _blank_boxes(_FileBoxes(handle), path.stat().st_size)
            except struct.error as exc:
                raise MetadataError("an MP4 box is cut short") from exc
        return
    data = path.read_bytes()
    stripped = strip(data)
    if stripped != data:
        part = path.with_name(path.name + ".part")
        part.write_bytes(stripped)
        part.replace(path)


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
    """A PNG without text, EXIF, time or private chunks; its ICC profile without text."""
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
        if kind == b"iCCP":
            out.append(_png_iccp(data[pos + 8 : end - 4]))
        elif kind in _PNG_KEEP:
            out.append(data[pos:end])
        pos = end
        if kind == b"IEND":
            break  # bytes after the end are someone's appendix, not the image
    return b"".join(out)


def _png_iccp(payload: bytes) -> bytes:
    """An `iCCP` chunk whose profile has no text (name, zero, method, zlib data)."""
    name_end = payload.find(b"\x00", 0, 80)
    if name_end < 1 or name_end + 2 > len(payload) or payload[name_end + 1] != 0:
        raise MetadataError("a PNG colour profile is damaged")
    inflate = zlib.decompressobj()
    profile = inflate.decompress(payload[name_end + 2 :], _ICC_MAX_BYTES)
    if inflate.unconsumed_tail or not inflate.eof:
        raise MetadataError("a PNG colour profile is damaged or too large")
    # The profile's name is free text too: every writer may put anything there.
    body = b"iCCP" + b"ICC\x00\x00" + zlib.compress(strip_icc(profile))
    return struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))


def strip_jpeg(data: bytes) -> bytes:
    """A JPEG without EXIF, XMP, IPTC, comments or anything after its last scan; JFIF,
    ICC (without its text) and Adobe segments stay."""
    if not data.startswith(b"\xff\xd8"):
        raise MetadataError("not a JPEG")
    out: list[bytes] = [b"\xff\xd8"]
    icc: list[int] = []  # indexes in `out` of the ICC profile's APP2 segments
    pos = 2
    size = len(data)
    scanned = False
    while True:
        if pos + 2 > size or data[pos] != 0xFF:
            raise MetadataError("a JPEG marker is missing")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xD9:  # end of image: whatever follows is not this image
            out.append(b"\xff\xd9")
            break
        if marker in _JPEG_STANDALONE:
            out.append(data[pos : pos + 2])
            pos += 2
            continue
        if pos + 4 > size:
            raise MetadataError("a JPEG segment is cut short")
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        end = pos + 2 + length
        if length < 2 or end > size:
            raise MetadataError("a JPEG segment is cut short")
        if marker == 0xDA:  # start of scan: its header, then entropy-coded data
            found = _JPEG_NEXT_MARKER.search(data, end)
            if found is None:
                raise MetadataError("a JPEG scan has no end")
            out.append(data[pos : found.start()])
            pos = found.start(1) - 1
            scanned = True
            continue
        if scanned:
            if marker in _JPEG_BETWEEN_SCANS:
                out.append(data[pos:end])
            elif not 0xE0 <= marker <= 0xEF and marker != 0xFE:
                raise MetadataError("a JPEG has an unexpected marker between scans")
        elif _keep_jpeg_segment(marker, data[pos + 4 : end]):
            if marker == 0xE2:
                icc.append(len(out))
            out.append(data[pos:end])
        pos = end
    if icc:
        _strip_jpeg_icc(out, icc)
    return b"".join(out)


def _strip_jpeg_icc(out: list[bytes], indexes: list[int]) -> None:
    """Blank the text of an ICC profile split over APP2 segments, each keeping its size."""
    head = 4 + 14  # marker, length, "ICC_PROFILE\0", sequence number, count
    parts = sorted(indexes, key=lambda i: out[i][head - 2])
    profile = b"".join(out[i][head:] for i in parts)
    try:
        cleaned = strip_icc(profile)
    except MetadataError:
        # A profile we cannot read may hide anything: the image goes without it.
        for i in indexes:
            out[i] = b""
        return
    offset = 0
    for i in parts:
        length = len(out[i]) - head
        out[i] = out[i][:head] + cleaned[offset : offset + length]
        offset += length


def _keep_jpeg_segment(marker: int, payload: bytes) -> bool:
    if marker == 0xFE:  # comment
        return False
    if marker == 0xE0:
        return payload.startswith((b"JFIF\x00", b"JFXX\x00"))
    if marker == 0xE2:
        return payload.startswith(b"ICC_PROFILE\x00") and len(payload) > 14
    if marker == 0xEE:
        return payload.startswith(b"Adobe")  # its transform flag changes the colours
    return not 0xE1 <= marker <= 0xEF  # every other APPn is metadata


def strip_icc(profile: bytes) -> bytes:
    """An ICC profile of the same size whose text and date tags are zero-filled (their
    type signature kept) and whose profile ID is cleared; its colour data unchanged.

    Raises:
        MetadataError: not an ICC profile, or its tag table points outside it.
    """
    size = len(profile)
    if size < 132 or profile[36:40] != b"acsp":
        raise MetadataError("not an ICC profile")
    (count,) = struct.unpack(">I", profile[128:132])
    if count > _ICC_MAX_TAGS or 132 + 12 * count > size:
        raise MetadataError("an ICC profile's tag table is damaged")
    out = bytearray(profile)
    out[84:100] = bytes(16)  # the ID is an MD5 of the old bytes: zero means "not computed"
    out[24:36] = bytes(12)  # when the profile was made
    for i in range(count):
        entry = 132 + 12 * i
        offset, length = struct.unpack(">II", profile[entry + 4 : entry + 12])
        if offset + length > size or length < 8 or offset < 132:
            raise MetadataError("an ICC profile's tag points outside it")
        if profile[offset : offset + 4] in _ICC_TEXT_TYPES:
            out[offset + 8 : offset + length] = bytes(length - 8)
    return bytes(out)


# The chunks that draw the picture: kept by name, as PNG's and JPEG's are, so a chunk
# whose name was changed (an `EXIF` renamed to anything else) cannot carry its text along.
_WEBP_KEEP = frozenset({b"VP8 ", b"VP8L", b"ALPH", b"ANIM", b"ANMF"})


def strip_webp(data: bytes) -> bytes:
    """A WebP of its picture chunks only (no EXIF, XMP or unknown chunks); its ICC
    profile without text."""
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
            if size < 10:
                raise MetadataError("a WebP header is cut short")
            header = bytearray(data[pos:end])
            header[8] &= ~0x0C & 0xFF  # no EXIF (0x08), no XMP (0x04)
            out.append(header)
        elif kind == b"ICCP":
            out.append(data[pos : pos + 8] + strip_icc(data[pos + 8 : pos + 8 + size]))
            out.append(data[pos + 8 + size : end])
        elif kind in _WEBP_KEEP:
            out.append(data[pos:end])
        pos = end
    body = b"WEBP" + b"".join(out)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def strip_mp4(data: bytes) -> bytes:
    """An MP4/MOV whose `udta`, `meta` and `uuid` boxes (title, encoder, XMP, ComfyUI's
    prompt and workflow) are blanked into `free` boxes of the same size."""
    if data[4:8] != b"ftyp":
        raise MetadataError("not an MP4")
    out = bytearray(data)
    _blank_boxes(_MemoryBoxes(out), len(out))
    return bytes(out)


class _MemoryBoxes:
    def __init__(self, buf: bytearray) -> None:
        self.buf = buf

    def header(self, pos: int) -> bytes:
        return bytes(self.buf[pos : pos + 16])

    def blank(self, pos: int, header: int, size: int) -> None:
        self.buf[pos + 4 : pos + 8] = b"free"
        self.buf[pos + header : pos + size] = bytes(size - header)


class _FileBoxes:
    """The same on an open file: only box headers are read."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle

    def header(self, pos: int) -> bytes:
        self.handle.seek(pos)
        return self.handle.read(16)

    def blank(self, pos: int, header: int, size: int) -> None:
        self.handle.seek(pos + 4)
        self.handle.write(b"free")
        self.handle.seek(pos + header)
        left = size - header
        while left > 0:
            chunk = min(left, 1 << 20)
            self.handle.write(bytes(chunk))
            left -= chunk


def _blank_boxes(boxes: _MemoryBoxes | _FileBoxes, total: int) -> None:
    """Walk the box tree without recursion, blanking metadata boxes; bounded in boxes
    and depth."""
    stack = [(0, total)]  # (next box, end of its enclosing box)
    seen = 0
    while stack:
        pos, end = stack.pop()
        if pos + 8 > end:
            continue
        head = boxes.header(pos)
        (size,) = struct.unpack(">I", head[:4])
        kind = head[4:8]
        header = 8
        if size == 1:
            if pos + 16 > end or len(head) < 16:
                raise MetadataError("an MP4 box is cut short")
            (size,) = struct.unpack(">Q", head[8:16])
            header = 16
        elif size == 0:
            size = end - pos  # to the end of the enclosing box
        if size < header or pos + size > end:
            raise MetadataError("an MP4 box is cut short")
        seen += 1
        if seen > _MP4_MAX_BOXES:
            raise MetadataError("an MP4 file has too many boxes")
        stack.append((pos + size, end))  # its next sibling, after its children
        if kind in _MP4_METADATA:
            boxes.blank(pos, header, size)
        elif kind in _MP4_CONTAINERS:
            if len(stack) > _MP4_MAX_DEPTH:
                raise MetadataError("an MP4 file's boxes are nested too deep")
            stack.append((pos + header, pos + size))


_STRIPPERS = {"png": strip_png, "jpeg": strip_jpeg, "webp": strip_webp, "mp4": strip_mp4}
