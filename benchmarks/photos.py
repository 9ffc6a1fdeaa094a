"""Photo-like test images for the benchmarks, made here (no files, no network)."""

from __future__ import annotations

import io
import random

from PIL import Image, ImageChops, ImageDraw


def photo(width: int, height: int, seed: int = 1, rough: float = 0.75) -> Image.Image:
    """Octaves of random noise, each half the size and `rough` times the contrast of the
    one before: the spectrum of a photo, falling with frequency (more `rough`, more fine
    detail)."""
    rnd = random.Random(seed)
    coarse = Image.frombytes("RGB", (8, 6), rnd.randbytes(8 * 6 * 3))
    image = coarse.resize((width, height), Image.Resampling.BICUBIC)
    cell, amp = max(width, height) // 16, rough
    while cell >= 1:
        cw, ch = max(1, width // cell), max(1, height // cell)
        layer = Image.frombytes("RGB", (cw, ch), rnd.randbytes(cw * ch * 3))
        if (cw, ch) != (width, height):
            layer = layer.resize((width, height), Image.Resampling.BICUBIC)
        layer = layer.point(lambda v, a=amp: 128 + (v - 128) * a)
        image = ImageChops.add(image, layer, offset=-128)
        cell //= 2
        amp *= rough
    return image


def phone_jpeg() -> bytes:
    """A 12-megapixel JPEG (4000 x 3000, quality 92) of about 4.5 MB, as a phone's."""
    out = io.BytesIO()
    photo(4000, 3000).save(out, "JPEG", quality=92)
    return out.getvalue()


def screenshot_png() -> bytes:
    """2560 x 1600 (4 MP): a photo in an app's frame, a title bar, lines of text."""
    image = Image.new("RGB", (2560, 1600), (250, 250, 250))
    image.paste(photo(1800, 1200, seed=2), (380, 200))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 2560, 90), fill=(30, 60, 160))
    for row in range(200, 1560, 22):
        draw.text((20, row), "the quick brown fox jumps", fill=(20, 20, 20))
        draw.text((2200, row), "over the lazy dog 0123", fill=(20, 20, 20))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()
