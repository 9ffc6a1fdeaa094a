"""A short, fixed-seed run of every fuzz target (tests/fuzz/targets.py), and the inputs
that once broke a parser, each kept as an explicit example.

`make fuzz` runs the same targets for a million inputs (scripts/fuzz.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings

from tests.fuzz import targets

# Fixed seed and no example database: the suite's run is the same every time and leaves
# no files behind; the long campaign draws fresh inputs.
SHORT = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@SHORT
@given(targets.CHAT.inputs)
@example(("/f a fox --steps 4 --ar 21:9", False, True, True, 2000))
@example(("/f лиса --шаги 3", False, True, True, 2000))
def test_chat_commands(case: Any) -> None:
    targets.CHAT.check(case)


@SHORT
@given(targets.ASPECT.inputs)
@example("inf:1")
@example("1e400:1")
def test_aspect_ratios(text: str) -> None:
    targets.ASPECT.check(text)


@SHORT
@given(targets.VALUES.inputs)
# A whole number past any float, given to a float option: float() overflowed (500).
@example((8, 10**400))
# ... to a whole-number option with a step and no bounds: the step check overflowed.
@example((7, 10**400))
def test_option_values(case: Any) -> None:
    targets.VALUES.check(case)


def test_a_huge_number_is_refused_in_a_short_sentence() -> None:
    ratio = targets._PARAMS[8]  # a float option with a step and no bounds
    with pytest.raises(targets.params.ParamError) as refused:
        ratio.convert(10**400)
    assert len(str(refused.value)) < 120


@SHORT
@given(targets.WORKFLOW.inputs)
def test_workflow_files(case: Any) -> None:
    targets.WORKFLOW.check(case)


@SHORT
@given(targets.IMAGE.inputs)
def test_uploaded_images(data: bytes) -> None:
    targets.IMAGE.check(data)


def test_a_photo_with_damaged_exif_is_checked_not_a_crash() -> None:
    # A JPEG whose EXIF block is cut inside: Pillow raised SyntaxError ("not a TIFF file")
    # from reading the orientation, which reached the user as an internal error.
    photo = targets.seed_files()[1]
    for mutation in (("flip", 34, 1), ("huge", 30, 0xFFFFFFFF), ("flip", 28, 0)):
        targets.IMAGE.check(targets.mutate(photo, [mutation]))


@SHORT
@given(targets.STRIP.inputs)
def test_metadata_stripper(data: bytes) -> None:
    targets.STRIP.check(data)


def test_a_renamed_exif_chunk_of_a_webp_does_not_carry_its_text_along() -> None:
    # The stripper dropped chunks named EXIF and XMP and kept any other: one byte of the
    # name changed, and the camera's text stayed in what we stored and sent.
    webp = targets.seed_files()[2]
    at = webp.index(b"EXIF")
    renamed = targets.mutate(webp, [("flip", at, 0)])
    assert b"PhoneMaker" in renamed
    assert b"PhoneMaker" not in targets.metadata.strip(renamed)
    checked = targets.images.check_image(renamed, max_bytes=10**7, max_pixels=10**7)
    assert b"PhoneMaker" not in checked.data


@SHORT
@given(targets.CALLBACK.inputs)
def test_button_data(data: str) -> None:
    targets.CALLBACK.check(data)


def test_json_nested_past_the_stack_from_a_backend_is_a_protocol_error() -> None:
    # A hostile GPU host's "[[[[...": json raised RecursionError, which no caller expected.
    from comfyveil.comfy import errors, events

    with pytest.raises(errors.BackendProtocolError):
        events.parse_text("[" * 100_000)


def test_an_infinite_image_count_is_refused_as_any_bad_count() -> None:
    # JSON's 1e400 reads as infinity; int() of it raised OverflowError, a 500.
    from comfyveil.api import errors as api_errors
    from comfyveil.api import image_request

    for value in (float("inf"), float("-inf"), float("nan"), 10**400):
        with pytest.raises(api_errors.ApiError) as refused:
            image_request.count(value)
        assert refused.value.status == 400


@SHORT
@given(targets.UPDATES.inputs)
# A message whose date is text, and an update without its id (a network error to PTB).
@example(b'{"ok": true, "result": [{"update_id": 5, "message": {"date": "soon"}}]}')
@example(b'{"ok": true, "result": [{"message": {}}]}')
def test_bot_api_updates(body: bytes) -> None:
    targets.UPDATES.check(body)
