"""An input image scaled down to the size its workflow uses, in the fewest bytes that
change nothing the workflow sees (pure, CPU-bound: call through `shrink_async`).

The pixels are made as ComfyUI's ``LoadImage`` makes them (EXIF orientation applied,
converted to RGB, the alpha dropped) and scaled with Lanczos, the filter ComfyUI's own
``lanczos`` scaling uses (Pillow's), to the size an ``ImageScaleToTotalPixels`` that
follows makes, so that node has nothing left to do. They are then sent as the smallest
of:

- the original file, untouched (ComfyUI scales it itself, as it did before);
- lossless PNG of the scaled pixels, and for a drawn image (a screenshot: few bits a
  pixel as PNG) lossless WebP; not tried for a JPEG original (a photo) whose JPEG
  below needs less than the highest quality: a lossless photo is larger;
- JPEG (4:4:4, no chroma subsampling) of the scaled pixels at the lowest quality whose
  decoded pixels keep a PSNR of `MIN_PSNR` dB against the lossless ones (an error of
  about one level in 255), checked for each image: a photo's fine grain needs 98-99.

A file Pillow cannot read, an animation (ComfyUI loads its frames as a batch), a 16-bit
or float image, one whose alpha the workflow uses, or one with more pixels than the
limit (read from its header, before anything is decoded) is sent as it is.
"""

from __future__ import annotations

import asyncio
import io
import math
import threading
import warnings
from dataclasses import dataclass

from PIL import Image, ImageChops, ImageOps, ImageStat

from comfyveil.comfy.fit import Fit

__all__ = ["MIN_PSNR", "Shrunk", "psnr", "shrink", "shrink_async"]

MIN_PSNR = 45.0  # dB between the sent pixels and the lossless ones
_JPEG_QUALITIES = (90, 92, 94, 95, 96, 97, 98, 99, 100)  # the lowest that keeps MIN_PSNR
_JPEG_FIRST = 98  # what a photo's grain needs, most often: the search starts there
_REDUCING_GAP = 1.5
_PNG_WORTH = 1.25  # a quick PNG within this of the JPEG: the thorough one may win
_ORIENTATION = 0x0112  # EXIF: how a phone's photo is to be turned to be shown
_TURNED = {5, 6, 7, 8}  # the orientations that swap width and height
_DRAWN_BITS = 8  # bits a pixel as PNG: fewer is a drawn image, not a photo
_FORMATS = {"JPEG", "PNG", "WEBP"}
_MODES = {"RGB", "RGBA", "RGBX", "L", "LA", "P", "PA", "CMYK", "YCbCr", "1"}
_MIME = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp"}
# Scaling a 40-megapixel photo holds ~300 MB of pixels: at most two at once. A thread's
# semaphore: the worker's jobs may run on more than one event loop (tests, the CLI).
_AT_ONCE = threading.BoundedSemaphore(2)


@dataclass(frozen=True, slots=True)
class Shrunk:
    """What to send instead of the original."""

    data: bytes
    mime: str
    width: int
    height: int
    quality: int = 0  # a JPEG's; 0 for lossless or the original


def shrink(data: bytes, fit: Fit, *, max_pixels: int) -> Shrunk | None:
    """The image `data` at the size `fit` gives, in its smallest faithful encoding; None
    to send the original as it is (it is already that size, or is one to leave alone)."""
    if not fit.limited:
        return None
    try:
        with _AT_ONCE, warnings.catch_warnings():
            # Our own limit decides (the image passed it when the user sent it).
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                return _shrink(image, data, fit, max_pixels)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None  # sent as it is: the backend says what it makes of it


async def shrink_async(data: bytes, fit: Fit, *, max_pixels: int) -> Shrunk | None:
    """`shrink` off the event loop (at most two at a time)."""
    if not fit.limited:
        return None
    return await asyncio.to_thread(shrink, data, fit, max_pixels=max_pixels)


def _shrink(image: Image.Image, data: bytes, fit: Fit, max_pixels: int) -> Shrunk | None:
    width, height = image.size
    if (
        image.format not in _FORMATS
        or image.mode not in _MODES
        or getattr(image, "n_frames", 1) > 1
        or width * height > max_pixels
    ):
        return None
    if fit.uses_mask and ("A" in image.getbands() or "transparency" in image.info):
        return None  # the mask is the alpha at the image's own size
    shown = (height, width) if image.getexif().get(_ORIENTATION) in _TURNED else (width, height)
    target = fit.size(*shown)
    if target[0] >= shown[0] and target[1] >= shown[1]:
        return None  # decided from the header: nothing decoded
    turned = ImageOps.exif_transpose(image)
    # An exact 2x box reduction first where the image is 3x larger or more (Pillow's
    # reducing_gap): a fifth of the CPU, within 50 dB of Lanczos from the full image.
    rgb = turned.convert("RGB")
    scaled = rgb.resize(target, Image.Resampling.LANCZOS, reducing_gap=_REDUCING_GAP)
    best = Shrunk(data, _MIME[image.format], width, height)
    for candidate in _encodings(scaled, lossy=image.format == "JPEG"):
        if len(candidate.data) < len(best.data):
            best = candidate
    return None if best.data is data else best


def _encodings(scaled: Image.Image, *, lossy: bool) -> list[Shrunk]:
    """The candidates: a JPEG first; for an original that was a JPEG (a photo) that is
    enough unless it needed the highest quality, since a lossless copy of a photo is
    larger; for a PNG or WebP (perhaps drawn) PNG too, and WebP where it is drawn."""
    jpeg = _jpeg(scaled)
    found = [] if jpeg is None else [jpeg]
    if lossy and jpeg is not None and jpeg.quality < _JPEG_QUALITIES[-1]:
        return found
    # A quick PNG first: where even it is far larger than the JPEG, a slow one (a tenth
    # smaller) cannot win either.
    png = _encode(scaled, "PNG", compress_level=1)
    found.append(png)
    if jpeg is None or len(png.data) < _PNG_WORTH * len(jpeg.data):
        found.append(_encode(scaled, "PNG"))
    if len(png.data) * 8 < _DRAWN_BITS * scaled.width * scaled.height:
        # A drawn image (a screenshot): WebP's lossless mode often takes a third off PNG;
        # on a photo it saves next to nothing for seconds of CPU.
        found.append(_encode(scaled, "WEBP", lossless=True))
    return found


def _jpeg(scaled: Image.Image) -> Shrunk | None:
    """The JPEG at the lowest quality that keeps MIN_PSNR, or None when even the highest
    does not. The walk starts at the quality most photos need and goes down while it
    keeps it, up while it does not (the error falls as the quality rises): two tries
    for most images."""
    index = _JPEG_QUALITIES.index(_JPEG_FIRST)
    best: Shrunk | None = None
    step = 0
    while 0 <= index < len(_JPEG_QUALITIES):
        jpeg = _encode(scaled, "JPEG", quality=_JPEG_QUALITIES[index], subsampling=0, optimize=True)
        with Image.open(io.BytesIO(jpeg.data)) as decoded:
            kept = psnr(scaled, decoded.convert("RGB")) >= MIN_PSNR
        if kept:
            best = jpeg
            if step > 0:
                break  # the first that keeps it, going up
            step = -1
        elif step < 0 or index == len(_JPEG_QUALITIES) - 1:
            break  # the one above kept it, or none does
        else:
            step = 1
        index += step
    return best


def _encode(image: Image.Image, fmt: str, **options: object) -> Shrunk:
    buffer = io.BytesIO()
    try:
        image.save(buffer, fmt, **options)  # Pillow writes no EXIF or text unless asked
    except OSError:
        if not options.get("optimize"):
            raise
        # Pillow's optimizing JPEG writer holds 2 bytes a pixel: grain at quality 99+
        # takes more. Without the optimization it streams.
        buffer = io.BytesIO()
        image.save(buffer, fmt, **{**options, "optimize": False})
    quality = int(options.get("quality", 0))  # type: ignore[call-overload]
    return Shrunk(buffer.getvalue(), _MIME[fmt], image.width, image.height, quality)


def psnr(a: Image.Image, b: Image.Image) -> float:
    """Peak signal-to-noise ratio of two RGB images of one size, in dB (inf: equal)."""
    squares = ImageStat.Stat(ImageChops.difference(a, b)).sum2
    mse = sum(squares) / (a.width * a.height * len(squares))
    return math.inf if mse == 0 else 10 * math.log10(255 * 255 / mse)
