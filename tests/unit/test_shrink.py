"""An input image scaled down to the size its workflow uses, in the fewest bytes that
change nothing it sees."""

from __future__ import annotations

import io
import random
import threading
from typing import Any

import pytest
from PIL import Image, ImageDraw

from comfyveil.comfy import fit, shrink

TARGET = (400, 300)  # what the fit below asks of an 800 x 600 image
BOX = fit.Fit(max_side=400)
LIMIT = 40_000_000


def photo(width: int = 800, height: int = 600, seed: int = 1) -> Image.Image:
    """Smooth shapes with grain: what a camera sends, small."""
    rnd = random.Random(seed)
    coarse = Image.frombytes("RGB", (16, 12), rnd.randbytes(16 * 12 * 3))
    image = coarse.resize((width, height), Image.Resampling.BICUBIC)
    grain = Image.frombytes("RGB", (width, height), rnd.randbytes(width * height * 3))
    return Image.blend(image, grain, 0.1)


def screenshot(width: int = 800, height: int = 600) -> Image.Image:
    """Flat colours, lines of text: a screen."""
    image = Image.new("RGB", (width, height), (250, 250, 250))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, width, 40), fill=(30, 60, 160))
    for row in range(60, height, 16):
        draw.text(
            (10, row), "the quick brown fox jumps over the lazy dog 0123456789", fill=(20, 20, 20)
        )
    return image


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def opened(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return image


@pytest.mark.parametrize(
    ("image", "fmt"), [(photo(), "PNG"), (photo(), "JPEG"), (screenshot(), "PNG")]
)
def test_a_large_image_is_sent_smaller_and_as_the_workflow_would_see_it(
    image: Image.Image, fmt: str
) -> None:
    original = encoded(image, fmt, quality=95)
    sent = shrink.shrink(original, BOX, max_pixels=LIMIT)
    assert sent is not None and len(sent.data) < len(original)
    assert (sent.width, sent.height) == TARGET == opened(sent.data).size
    assert sent.mime == Image.MIME[opened(sent.data).format or ""]
    # Against the lossless image at that size (what ComfyUI's own Lanczos would make from
    # the original): nothing the workflow could see.
    lossless = opened(original).convert("RGB").resize(TARGET, Image.Resampling.LANCZOS)
    assert shrink.psnr(lossless, opened(sent.data).convert("RGB")) >= shrink.MIN_PSNR


def test_the_lossy_choice_keeps_the_psnr_a_photo_needs() -> None:
    # Grain is the hardest for JPEG: the quality rises until the error is small enough.
    sent = shrink.shrink(encoded(photo(), "PNG"), BOX, max_pixels=LIMIT)
    assert sent is not None and sent.mime == "image/jpeg"
    lossless = photo().resize(TARGET, Image.Resampling.LANCZOS)
    assert 45 <= shrink.psnr(lossless, opened(sent.data).convert("RGB")) < 60


def test_an_image_within_the_size_goes_as_it_is() -> None:
    small = encoded(photo(400, 300), "JPEG")
    assert shrink.shrink(small, BOX, max_pixels=LIMIT) is None  # never scaled up
    assert shrink.shrink(encoded(photo(), "PNG"), fit.Fit(), max_pixels=LIMIT) is None


def test_the_original_goes_when_nothing_smaller_keeps_the_pixels() -> None:
    # A coarse JPEG: at half the size, anything that keeps its pixels takes more bytes.
    coarse = encoded(photo(), "JPEG", quality=30)
    assert shrink.shrink(coarse, BOX, max_pixels=LIMIT) is None


def test_an_image_past_the_pixel_limit_is_not_decoded() -> None:
    data = encoded(photo(), "PNG")
    assert shrink.shrink(data, BOX, max_pixels=800 * 600 - 1) is None
    assert shrink.shrink(b"not an image", BOX, max_pixels=LIMIT) is None


def test_a_turned_phone_photo_is_turned_as_comfyui_loads_it() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to show it
    exif[0x010F] = "PhoneMaker"
    data = encoded(photo(), "JPEG", quality=95, exif=exif)
    sent = shrink.shrink(data, BOX, max_pixels=LIMIT)
    assert sent is not None and (sent.width, sent.height) == (300, 400)
    assert not opened(sent.data).getexif()  # no camera, no orientation left to apply
    # Turned, it is 400 high: within the size, so it goes as it is (with its orientation).
    assert shrink.shrink(encoded(photo(400, 300), "JPEG", exif=exif), BOX, max_pixels=LIMIT) is None


def test_alpha_is_dropped_as_comfyuis_image_output_drops_it() -> None:
    rgba = photo().convert("RGBA")
    rgba.putalpha(Image.new("L", rgba.size, 0))  # invisible, yet ComfyUI's IMAGE has it
    sent = shrink.shrink(encoded(rgba, "PNG"), BOX, max_pixels=LIMIT)
    assert sent is not None
    lossless = photo().resize(TARGET, Image.Resampling.LANCZOS)
    assert shrink.psnr(lossless, opened(sent.data).convert("RGB")) >= shrink.MIN_PSNR
    # Where the workflow uses the mask (the alpha), the image goes as it is.
    with_mask = fit.Fit(max_side=400, uses_mask=True)
    assert shrink.shrink(encoded(rgba, "PNG"), with_mask, max_pixels=LIMIT) is None


def test_an_animation_goes_as_it_is() -> None:
    frames = [photo(seed=1), photo(seed=2)]
    out = io.BytesIO()
    frames[0].save(out, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    assert shrink.shrink(out.getvalue(), BOX, max_pixels=LIMIT) is None


async def test_shrinking_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []
    real = shrink.shrink

    def recording(*args: Any, **kwargs: Any) -> shrink.Shrunk | None:
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(shrink, "shrink", recording)
    sent = await shrink.shrink_async(encoded(photo(), "PNG"), BOX, max_pixels=LIMIT)
    assert sent is not None and (sent.width, sent.height) == TARGET
    assert threads and threads[0] is not threading.main_thread()


def test_grain_that_needs_the_highest_quality_is_still_encoded() -> None:
    # Pure noise: JPEG at quality 100 takes more than the 2 bytes a pixel Pillow's
    # optimizing writer holds; it is written anyway, or PNG wins.
    rnd = random.Random(3)
    noise = Image.frombytes("RGB", (800, 600), rnd.randbytes(800 * 600 * 3))
    sent = shrink.shrink(encoded(noise, "PNG", compress_level=1), BOX, max_pixels=LIMIT)
    assert sent is not None and (sent.width, sent.height) == TARGET
