"""Fuzzing the HTTP front doors: the images API's JSON and multipart bodies and the web
form of a command, sent to the real server (the web front end with the API, a real
PostgreSQL, a fake ComfyUI).

Hypothesis drives pure functions best; a server is driven here by drawing a batch of
inputs from the same strategies first (in a thread: Hypothesis' engine is synchronous)
and sending them one by one. What is checked of each answer: no 5xx, and a refusal in
the front end's own shape (OpenAI's error object for the API).
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.fuzz.targets import _JSON, _MUTATION, mutate


def draw(strategy: st.SearchStrategy[Any], count: int, *, seed: int | None = 0) -> list[Any]:
    """`count` inputs from `strategy`, the same ones for the same seed."""
    drawn: list[Any] = []

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=seed is not None,
    )
    @given(strategy)
    def collect(value: Any) -> None:
        drawn.append(value)

    collect()
    return drawn


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (10, 200, 30)).save(out, "PNG")
    return out.getvalue()


_FIELD_VALUES = st.one_of(
    _JSON,
    st.sampled_from(
        [
            "f",
            "qwen",
            "wan",
            "",
            "auto",
            "1024x1024",
            "0x0",
            "99999x99999",
            "320x256",
            "b64_json",
            "url",
            "jpeg",
            "webp",
            "png",
            "gif",
            1e308,
            -1,
            0,
            11,
            1.5,
            True,
            "1e400",
            "💥" * 50,
            "\x00",
            "a" * 3000,
            None,
            [],
            {},
        ]
    ),
)
_KNOWN_FIELDS = [
    "model",
    "prompt",
    "n",
    "size",
    "response_format",
    "output_format",
    "output_compression",
    "stream",
    "quality",
    "style",
    "background",
    "user",
    "moderation",
    "partial_images",
    "image",
    "mask",
]
GENERATION_BODIES = st.one_of(
    st.dictionaries(st.sampled_from(_KNOWN_FIELDS), _FIELD_VALUES, max_size=7),
    st.dictionaries(st.sampled_from(_KNOWN_FIELDS), _FIELD_VALUES, max_size=4).map(
        lambda body: {"model": "f", "prompt": "a fox", **body}
    ),
    _JSON,
).map(lambda body: json.dumps(body).encode())
# Raw bytes too: what is not JSON at all, cut JSON, JSON with a huge number.
RAW_BODIES = st.one_of(
    GENERATION_BODIES,
    st.binary(max_size=64),
    GENERATION_BODIES.flatmap(lambda b: st.integers(0, len(b)).map(lambda at: b[:at])),
    st.sampled_from(
        [
            b'{"model": "f", "prompt": "x", "n": 1e400}',
            b'{"model": "f", "prompt": "x", "n": ' + b"9" * 5000 + b"}",
            b'{"model": "f", "prompt": "\\ud800"}',
            b"[" * 10000,
            b"\xff\xfe",
        ]
    ),
)

_PART_NAMES = st.sampled_from(
    [
        "image",
        "image[]",
        "mask",
        "model",
        "prompt",
        "n",
        "size",
        "response_format",
        "output_format",
        "",
        "x" * 300,
        "🦊",
    ]
)


def _part_body(case: tuple[str, Any]) -> bytes:
    kind, value = case
    if kind == "png":
        return _png()
    if kind == "mutated":
        return mutate(_png(), value)
    return str(value).encode("utf-8", "surrogatepass")


EDIT_PARTS = st.lists(
    st.tuples(
        _PART_NAMES,
        st.one_of(
            st.tuples(st.just("png"), st.none()),
            st.tuples(st.just("mutated"), st.lists(_MUTATION, max_size=3)),
            st.tuples(st.just("text"), _FIELD_VALUES),
        ).map(_part_body),
        st.sampled_from([None, "a.png", "../../etc/passwd", "x" * 300, "é.png"]),
    ),
    max_size=8,
)

FORM_FIELDS = st.dictionaries(
    st.one_of(
        st.sampled_from(
            [
                "prompt",
                "negative",
                "steps",
                "seed",
                "width",
                "height",
                "ar",
                "file",
                "csrf",
                "image",
                "",
            ]
        ),
        # a field's name goes into a header of its part: no client sends controls
        st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=10),
    ),
    st.one_of(
        st.text(max_size=40),
        _FIELD_VALUES.map(str),
        st.sampled_from(["1e400", "nan", "-0", "٣", "\x00", "4" * 5000]),
    ),
    max_size=8,
)


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()
