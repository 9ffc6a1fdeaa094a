"""Check that a file a user sent is a real, complete image within our limits, and take
its hidden metadata off (pure).

Pillow decodes in C and blocks: call :func:`check_image` with ``asyncio.to_thread``.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from comfyveil import errors, metadata
from comfyveil.i18n import N_, _, ltr

ACCEPTED_FORMATS = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp"}
# The images a result may be shown as or sent again as an input, and their file endings.
MIMES = {"image/jpeg": "jpg", "image/png": "png", "image/webp": "webp"}
ASK = N_("Send a JPEG, PNG or WebP photo.")  # translated where it is said
_ORIENTATION = 0x0112  # the EXIF tag a phone sets instead of rotating the pixels
_JPEG_QUALITY = 95  # re-encoding a rotated JPEG: as close to the original as it gets

# Signatures of files people send by mistake, so the answer can name what they sent.
_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"%PDF", N_("looks like a PDF")),
    (0, b"PK\x03\x04", N_("looks like a ZIP archive")),
    (0, b"\x1aE\xdf\xa3", N_("looks like a video")),
    (4, b"ftyp", N_("looks like a video")),
    (0, b"ID3", N_("looks like an audio file")),
    (0, b"OggS", N_("looks like an audio or video file")),
    (0, b"\x7fELF", N_("looks like a program")),
    (0, b"MZ", N_("looks like a program")),
)
# Images Pillow cannot read here (phones send these): name the format, don't call it "not an image".
_UNSUPPORTED_IMAGES: tuple[tuple[bytes, str], ...] = (
    (b"ftypheic", "HEIC"),
    (b"ftypheix", "HEIC"),
    (b"ftypmif1", "HEIF"),
    (b"ftypavif", "AVIF"),
)
_BOMB_PIXELS = re.compile(r"\((\d+) pixels\)")


class ImageRejected(errors.UsageError):
    """That file is not an image we can use."""


@dataclass(frozen=True)
class CheckedImage:
    """An image that decoded completely and is within the limits."""

    data: bytes
    width: int
    height: int
    format: str  # Pillow's name: JPEG, PNG, WEBP
    mime: str

    @property
    def pixels(self) -> int:
        return self.width * self.height


def check_image(data: bytes, *, max_bytes: int, max_pixels: int) -> CheckedImage:
    """Decode ``data`` fully, check it against the limits and drop its metadata.

    The returned bytes carry no EXIF (camera, time, GPS position), XMP or comments; the
    colour profile stays. A photo an EXIF orientation turns is turned first (re-encoded),
    the way ComfyUI's LoadImage would have shown it; any other is not re-encoded.

    Raises:
        ImageRejected: with a sentence for the user: not an image (naming what it looks
            like), an unsupported format, damaged or incomplete, too many bytes or pixels.
    """
    if not data:
        raise ImageRejected(_("That file is empty.") + " " + _(ASK))
    if len(data) > max_bytes:
        raise ImageRejected(_("That file is {size}; the limit is {limit}.").format(
            size=_megabytes(len(data)), limit=_megabytes(max_bytes)))
    try:
        with warnings.catch_warnings():
            # Pillow warns past MAX_IMAGE_PIXELS; our own limit below decides instead.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        found = _BOMB_PIXELS.search(str(exc))
        size = _megapixels(int(found.group(1))) if found else _("too large to open")
        raise ImageRejected(_("That image is {size}; the limit is {limit}.").format(
            size=size, limit=_megapixels(max_pixels))) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        for signature, kind in _UNSUPPORTED_IMAGES:
            if data[4 : 4 + len(signature)] == signature:
                raise ImageRejected(
                    _("That photo is in {kind} format, which is not supported.").format(
                        kind=ltr(kind)) + " " + _(ASK)
                ) from exc
        raise ImageRejected(_("That file is not an image ({looks}).").format(
            looks=_looks_like(data)) + " " + _(ASK)) from exc
    with image:
        width, height = image.size
        if image.format not in ACCEPTED_FORMATS:
            kind = image.format or "unknown"
            raise ImageRejected(_("That image is a {kind} file.").format(kind=ltr(kind)) + " "
                                + _(ASK))
        if width * height > max_pixels:
            raise ImageRejected(_("That image is {size}; the limit is {limit}.").format(
                size=_megapixels(width * height), limit=_megapixels(max_pixels)))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image.load()
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise ImageRejected(
                _("That image is damaged or incomplete; send it again.") + " " + _(ASK)
            ) from exc
        fmt = image.format
        try:
            cleaned, width, height = _without_metadata(image, data, fmt)
        except metadata.MetadataError as exc:  # decodes, yet its container is crafted
            raise ImageRejected(
                _("That image is damaged or incomplete; send it again.") + " " + _(ASK)
            ) from exc
    return CheckedImage(cleaned, width, height, fmt, ACCEPTED_FORMATS[fmt])


def _without_metadata(image: Image.Image, data: bytes, fmt: str) -> tuple[bytes, int, int]:
    """The image's bytes without metadata, its orientation applied; its new size."""
    orientation = image.getexif().get(_ORIENTATION, 1)
    if orientation in (None, 1) or not isinstance(orientation, int):
        return metadata.strip(data), image.width, image.height
    turned = ImageOps.exif_transpose(image)
    options: dict[str, object] = {}
    if image.info.get("icc_profile"):
        options["icc_profile"] = image.info["icc_profile"]
    if fmt == "JPEG":
        options.update(quality=_JPEG_QUALITY)
    elif fmt == "WEBP":
        options.update(quality=_JPEG_QUALITY, lossless=bool(image.info.get("lossless")))
    buffer = io.BytesIO()
    turned.save(buffer, fmt, **options)  # Pillow writes no EXIF unless it is asked to
    return metadata.strip(buffer.getvalue()), turned.width, turned.height


def _looks_like(data: bytes) -> str:
    for offset, signature, name in _SIGNATURES:
        if data[offset : offset + len(signature)] == signature:
            return _(name)
    head = data[:2048]
    if b"\x00" not in head:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as exc:
            # A multi-byte character cut at the end of the sample is still text.
            if exc.start < len(head) - 3:
                return _("its format is unknown")
        return _("looks like text")
    return _("its format is unknown")


def _megapixels(pixels: int) -> str:
    mp = pixels / 1_000_000
    return ltr(_("{n} MP").format(n=f"{mp:.0f}" if mp >= 10 else f"{mp:.1f}"))


def _megabytes(size: int) -> str:
    mb = size / (1024 * 1024)
    return ltr(_("{n} MB").format(n=f"{mb:.0f}" if mb >= 10 else f"{mb:.1f}"))


# What a browser may show inline, by the file's own bytes (not its name: a GPU host names
# its files). HEIC/AVIF share MP4's `ftyp` box: only the video brands count.
_MP4_BRANDS = (b"isom", b"iso2", b"iso4", b"iso5", b"iso6", b"mp41", b"mp42", b"avc1", b"M4V ",
               b"dash", b"qt  ")


def sniff_mime(data: bytes) -> str | None:
    """The type of a PNG, JPEG, WebP, GIF, MP4 or WebM file, from its leading bytes;
    None for anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[4:8] == b"ftyp" and data[8:12] in _MP4_BRANDS:
        return "video/mp4"
    if data.startswith(b"\x1a\x45\xdf\xa3") and b"\x42\x82\x84webm" in data[:64]:
        return "video/webm"
    return None
