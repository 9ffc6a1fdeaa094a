"""Metadata leaves inputs and outputs; the pixels and the colour profile stay."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from PIL import Image, ImageCms, PngImagePlugin

from comfyveil import images, metadata

SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


def _exif(orientation: int | None = None) -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "PhoneMaker"
    exif[0x8825] = {1: "N", 2: (48.0, 51.0, 24.0), 3: "E", 4: (2.0, 21.0, 3.0)}
    if orientation is not None:
        exif[0x0112] = orientation
    return exif.tobytes()


def _encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def _gradient(width: int = 40, height: int = 20) -> Image.Image:
    image = Image.new("RGB", (width, height))
    image.putdata([(x * 6, y * 12, 90) for y in range(height) for x in range(width)])
    return image


def test_comfyui_png_loses_prompt_workflow_and_exif_but_not_a_pixel() -> None:
    info = PngImagePlugin.PngInfo()
    info.add_text("prompt", '{"6": {"inputs": {"text": "my secret prompt"}}}')
    info.add_itxt("workflow", '{"nodes": []}', zip=True)
    original = _gradient()
    data = _encode(original, "PNG", pnginfo=info, exif=_exif(), icc_profile=SRGB)
    stripped = metadata.strip(data)
    assert b"secret" not in stripped and b"PhoneMaker" not in stripped
    with Image.open(io.BytesIO(stripped)) as image:
        assert set(image.info) <= {"icc_profile", "dpi"}
        assert image.info["icc_profile"] == metadata.strip_icc(SRGB)
        assert not image.getexif()
        assert image.tobytes() == original.tobytes()


def test_jpeg_loses_exif_gps_and_comments_keeps_icc_and_bytes_of_the_scan() -> None:
    data = _encode(
        _gradient(), "JPEG", exif=_exif(), comment=b"taken at home", icc_profile=SRGB, quality=90
    )
    stripped = metadata.strip(data)
    assert b"PhoneMaker" not in stripped and b"taken at home" not in stripped
    with Image.open(io.BytesIO(stripped)) as image:
        assert not image.getexif() and "comment" not in image.info
        assert image.info["icc_profile"] == metadata.strip_icc(SRGB)
    scan = data.index(b"\xff\xda")
    assert stripped.endswith(data[scan:])  # not re-encoded


def test_webp_loses_exif_and_xmp_chunks() -> None:
    data = _encode(
        _gradient(),
        "WEBP",
        exif=_exif(),
        xmp=b"<x:xmpmeta>secret</x:xmpmeta>",
        icc_profile=SRGB,
        lossless=True,
    )
    stripped = metadata.strip(data)
    assert b"PhoneMaker" not in stripped and b"secret" not in stripped
    with Image.open(io.BytesIO(stripped)) as image:
        image.load()
        assert "exif" not in image.info and "xmp" not in image.info
        assert image.info["icc_profile"] == metadata.strip_icc(SRGB)
        assert image.tobytes() == _gradient().tobytes()
    assert struct.unpack("<I", stripped[4:8])[0] == len(stripped) - 8


def test_mp4_metadata_boxes_become_free_space_and_nothing_moves() -> None:
    def box(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", 8 + len(payload)) + kind + payload

    comment = box(b"\xa9cmt", b'{"prompt": "my secret prompt"}')
    udta = box(b"udta", box(b"meta", b"\x00" * 4 + box(b"ilst", comment)))
    trak = box(b"trak", box(b"tkhd", b"\x00" * 20) + box(b"udta", box(b"name", b"secret")))
    moov = box(b"moov", box(b"mvhd", b"\x00" * 100) + trak + udta)
    data = box(b"ftyp", b"isom\x00\x00\x02\x00") + box(b"mdat", b"frames") + moov
    stripped = metadata.strip(data)
    assert len(stripped) == len(data) and b"secret" not in stripped
    assert stripped.count(b"free") == 2 and b"mdat" + b"frames" in stripped
    assert b"mvhd" in stripped and b"tkhd" in stripped


def test_unknown_files_come_back_unchanged_and_damaged_ones_are_refused() -> None:
    gif = _encode(_gradient(), "GIF", comment=b"kept")
    assert metadata.strip(gif) == gif  # GIF is documented as not handled
    cut = _encode(_gradient(), "PNG")[:30]
    # Its metadata cannot be told from its pixels: never passed on as it came.
    with pytest.raises(metadata.MetadataError):
        metadata.strip(cut)


def test_a_users_photo_is_stored_turned_upright_without_exif_or_gps() -> None:
    # A phone's portrait photo: landscape pixels and "turn 90 degrees" in EXIF.
    data = _encode(_gradient(40, 20), "JPEG", exif=_exif(orientation=6), icc_profile=SRGB)
    checked = images.check_image(data, max_bytes=10**7, max_pixels=10**8)
    assert (checked.width, checked.height) == (20, 40)
    with Image.open(io.BytesIO(checked.data)) as image:
        assert image.size == (20, 40) and not image.getexif()
        assert image.info["icc_profile"] == metadata.strip_icc(SRGB)
    assert b"PhoneMaker" not in checked.data


def test_an_upright_photo_is_not_re_encoded_only_stripped() -> None:
    data = _encode(_gradient(), "JPEG", exif=_exif(), quality=90)
    checked = images.check_image(data, max_bytes=10**7, max_pixels=10**8)
    assert b"PhoneMaker" not in checked.data and b"GPS" not in checked.data
    assert checked.data.endswith(data[data.index(b"\xff\xda") :])


def test_files_on_disk_are_stripped_in_place(tmp_path: Path) -> None:
    def box(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", 8 + len(payload)) + kind + payload

    moov = box(b"moov", box(b"mvhd", b"\x00" * 100) + box(b"udta", b"my secret prompt"))
    video = tmp_path / "clip.mp4"
    video.write_bytes(box(b"ftyp", b"isom\x00\x00\x02\x00") + moov + box(b"mdat", b"frames"))
    before = video.read_bytes()
    metadata.strip_path(video)
    after = video.read_bytes()
    assert len(after) == len(before) and b"secret" not in after and b"frames" in after
    assert after == metadata.strip(before)  # the same as in memory, without reading it
    info = PngImagePlugin.PngInfo()
    info.add_text("prompt", "my secret prompt")
    picture = tmp_path / "out.png"
    picture.write_bytes(_encode(_gradient(), "PNG", pnginfo=info))
    metadata.strip_path(picture)
    assert b"secret" not in picture.read_bytes() and not list(tmp_path.glob("*.part"))
    with Image.open(picture) as image:
        assert image.tobytes() == _gradient().tobytes()


# --- issue 22: what survived, crafted files --------------------------------------------


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _app(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", 2 + len(payload)) + payload


def test_jpeg_ends_at_the_eoi_of_its_last_scan_appended_files_go() -> None:
    # A phone's file: the photo, then an MPF second image with its own EXIF, then a
    # motion photo's MP4 and a maker's trailer.
    photo = _encode(_gradient(), "JPEG", quality=90)
    second = _encode(_gradient(8, 8), "JPEG", exif=_exif())
    video = _box(b"ftyp", b"isom") + _box(b"udta", b"taken at home")
    data = photo + second + video + b"MAKERTRAILER serial 12345"
    stripped = metadata.strip(data)
    assert stripped.endswith(b"\xff\xd9") and stripped.count(b"\xff\xd8") == 1
    for secret in (b"PhoneMaker", b"taken at home", b"serial 12345", b"ftyp"):
        assert secret not in stripped
    with Image.open(io.BytesIO(stripped)) as image:
        assert image.tobytes() == Image.open(io.BytesIO(photo)).tobytes()


def test_segments_between_progressive_scans_go_tables_stay() -> None:
    data = _encode(_gradient(64, 48), "JPEG", progressive=True, quality=90)
    scans = [i for i in range(len(data) - 1) if data[i : i + 2] == b"\xff\xda"]
    assert len(scans) > 2
    cut = scans[2]  # before the third scan: a comment and an XMP segment planted
    planted = _app(0xFE, b"hidden comment") + _app(0xE1, b"http://ns.adobe.com/xap/ secret")
    crafted = data[:cut] + planted + data[cut:]
    stripped = metadata.strip(crafted)
    assert b"hidden comment" not in stripped and b"secret" not in stripped
    assert stripped == metadata.strip(data)
    with Image.open(io.BytesIO(stripped)) as image:
        assert image.tobytes() == Image.open(io.BytesIO(data)).tobytes()


@pytest.mark.parametrize(
    "crafted",
    [
        b"\xff\xd8\xff",
        _encode(_gradient(), "JPEG")[:-2] + b"\xff",  # a trailing 0xFF instead of EOI
        _encode(_gradient(), "JPEG")[:200],  # cut inside the header
        b"RIFF\x10\x00\x00\x00WEBPVP8X\x00\x00\x00\x00",  # a VP8X chunk of size 0
        _box(b"ftyp", b"isom") + struct.pack(">I", 1000) + b"moov",  # past the end
    ],
    ids=["jpeg-soi-only", "jpeg-trailing-ff", "jpeg-cut", "webp-vp8x-empty", "mp4-cut"],
)
def test_crafted_files_are_one_plain_error(crafted: bytes) -> None:
    with pytest.raises(metadata.MetadataError):
        metadata.strip(crafted)


def test_deeply_nested_mp4_boxes_cost_no_recursion(tmp_path: Path) -> None:
    nested = _box(b"udta", b"my secret prompt")
    for _ in range(5000):
        nested = _box(b"trak", nested)
    data = _box(b"ftyp", b"isom\x00\x00\x02\x00") + _box(b"moov", nested)
    with pytest.raises(metadata.MetadataError):
        metadata.strip(data)
    video = tmp_path / "deep.mp4"
    video.write_bytes(data)
    with pytest.raises(metadata.MetadataError):
        metadata.strip_path(video)


def test_mp4_top_level_uuid_and_fragment_udta_are_blanked(tmp_path: Path) -> None:
    xmp = _box(b"uuid", bytes.fromhex("be7acfcb97a942e89c71999491e3afac") + b"<x:xmpmeta>secret")
    fragment = _box(
        b"moof",
        _box(b"mfhd", b"\x00" * 8)
        + _box(b"traf", _box(b"tfhd", b"\x00" * 8) + _box(b"udta", b"secret prompt")),
    )
    moov = _box(b"moov", _box(b"mvhd", b"\x00" * 100))
    data = _box(b"ftyp", b"isom\x00\x00\x02\x00") + moov + xmp + fragment + _box(b"mdat", b"x")
    stripped = metadata.strip(data)
    assert len(stripped) == len(data) and b"secret" not in stripped
    assert b"tfhd" in stripped and b"mfhd" in stripped and stripped.endswith(b"mdatx")
    video = tmp_path / "frag.mp4"
    video.write_bytes(data)
    metadata.strip_path(video)
    assert video.read_bytes() == stripped


def _profile_text(profile: bytes) -> str:
    return ImageCms.getProfileDescription(ImageCms.ImageCmsProfile(io.BytesIO(profile)))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_icc_profiles_keep_their_colours_but_lose_their_text(fmt: str) -> None:
    assert "sRGB" in _profile_text(SRGB)  # lcms writes "sRGB built-in" into desc
    data = _encode(_gradient(), fmt, icc_profile=SRGB)
    stripped = metadata.strip(data)
    assert "sRGB".encode("utf-16-be") not in stripped
    with Image.open(io.BytesIO(stripped)) as image:
        profile = image.info["icc_profile"]
        assert len(profile) == len(SRGB) and _profile_text(profile).strip() == ""
        # the colour data is the same: converting with either profile gives one result
        ours = ImageCms.ImageCmsProfile(io.BytesIO(profile))
        theirs = ImageCms.ImageCmsProfile(io.BytesIO(SRGB))
        lab = ImageCms.createProfile("LAB")
        rgb = _gradient()
        assert (
            ImageCms.profileToProfile(rgb, ours, lab, outputMode="LAB").tobytes()
            == ImageCms.profileToProfile(rgb, theirs, lab, outputMode="LAB").tobytes()
        )
