"""The result in the format a client asked for (``output_format``, ``output_compression``):
re-encoded from the stored output, which carries no metadata already, and written
without any (no EXIF, text chunks or XMP are copied over)."""

from __future__ import annotations

import io

from PIL import Image

from comfyveil import metadata

FORMATS = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
MIME_FORMATS = {mime: name for name, mime in FORMATS.items()}
DEFAULT_COMPRESSION = 100  # OpenAI's default: the best the format gives


def convert(data: bytes, mime: str, output_format: str, compression: int | None) -> bytes:
    """`data` (of type `mime`) as `output_format`; unchanged when it is that already and
    no compression was asked. `compression` 0-100 is OpenAI's: for JPEG and WebP the
    quality kept (100 the best), for PNG (lossless) how hard zlib tries, inverted."""
    if MIME_FORMATS.get(mime) == output_format and compression is None:
        return data
    level = DEFAULT_COMPRESSION if compression is None else compression
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        out = io.BytesIO()
        if output_format == "jpeg":
            flat = image.convert("RGBA") if image.mode not in ("RGB", "L") else image
            if flat.mode == "RGBA":  # JPEG has no alpha: lay it on white, as a viewer would
                background = Image.new("RGB", flat.size, (255, 255, 255))
                background.paste(flat, mask=flat.getchannel("A"))
                flat = background
            flat.save(out, "JPEG", quality=max(1, min(level, 95)), optimize=True)
        elif output_format == "webp":
            image.save(out, "WEBP", quality=level, lossless=level >= 100)
        else:
            image.save(out, "PNG", compress_level=round((100 - level) * 9 / 100))
        # Pillow copies a colour profile over; the stripper cleans it as it does any output
        return metadata.strip(out.getvalue())
