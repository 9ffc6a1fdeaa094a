"""What the fuzzers feed each parser, and what each parser may answer.

Every place that reads what a stranger sends is one target: a Hypothesis strategy that
makes inputs and a check that runs the parser on one of them. The property is the same for
all: an input is accepted, or refused with the module's one plain error. Any other
exception is a bug; so is a hang (the suite's short run is held to pytest-timeout, the
campaign in scripts/fuzz.py to a deadline per input and an address-space limit).

The suite (tests/fuzz/test_fuzz.py) runs each target briefly with a fixed seed;
`make fuzz` runs the same targets for a million inputs in all.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import strategies as st
from PIL import Image

from comfyveil import images, metadata
from comfyveil.comfy import bindings, params
from comfyveil.telegram import callbacks_data, parse, updates


@dataclass(frozen=True)
class Target:
    """One parser under fuzzing: inputs to make, and how to run one."""

    name: str
    inputs: st.SearchStrategy[Any]
    check: Callable[[Any], None]
    what: str


# --- the chat command parser ---------------------------------------------------------

# Pieces a user (or an attacker) puts in a command: options in every dash a phone makes,
# values, quotes of every kind, job references, right-to-left and invisible marks, words
# in several scripts, and very long words.
_CHAT_PIECES = st.sampled_from(
    [
        "--steps",
        "--seed",
        "--no",
        "--ar",
        "--file",
        "--width",
        "--height",
        "--cfg",
        "—steps",
        "–seed",
        "-steps",
        "−seed",
        "--",
        "—",
        "=",
        "==",
        "--=",
        "--steps=4",
        "4",
        "-1",
        "0",
        "1e9",
        "99999999999999999999",
        "16:9",
        "9:16",
        "1:0",
        "0:0",
        "x",
        "21:9",
        "100:1",
        "1.5:1",
        "nan:1",
        "inf:1",
        "16x9",
        "16×9",
        "16/9",
        '"',
        "'",
        "“",
        "”",
        "„",
        "«",
        "»",
        "‘",
        "’",
        '"a b"',
        "«лиса в снегу»",
        "#3f2a9c1d",
        "#",
        "#zz",
        "3f2a9c1d-0000-4000-8000-000000000000",
        "\u200f",
        "\u200e",
        "\u202e",
        "\u2066",
        "\u2069",
        "\u00a0",
        "\t",
        "\n",
        "\u3000",
        "лиса",
        "--шаги",
        "شب",
        "--گام",
        "狐狸",
        "🦊",
        "a" * 300,
        "yes",
        "no",
        "maybe",
        "@bot",
        "/f",
        "\x00",
        "\ud800",
    ]
)
_CHAT_TEXT = st.builds(
    lambda head, body, tail: head + body + tail,
    st.sampled_from(["/f", "/f@MyBot", "/F", "/qwen", "/f@OtherBot", "/cancel", " /f", "f"]),
    st.lists(st.one_of(_CHAT_PIECES, st.text(max_size=12)), max_size=14)
    .map(" ".join)
    .map(lambda s: " " + s),
    st.one_of(st.just(""), st.text(max_size=40)),
)
_CHAT_OPTIONS = {
    "steps": "steps",
    "seed": "seed",
    "width": "width",
    "height": "height",
    "cfg": "guidance",
}


def _chat(case: tuple[str, bool, bool, bool, int]) -> None:
    text, in_group, require_prompt, takes_prompt, limit = case
    try:
        parsed = parse.parse(
            text,
            _CHAT_OPTIONS,
            bot_username="MyBot",
            in_group=in_group,
            require_prompt=require_prompt,
            takes_prompt=takes_prompt,
            max_prompt_chars=limit,
        )
    except parse.ParseError as exc:
        assert str(exc).strip(), "a refusal says what is wrong"
        return
    if parsed is None:
        return
    assert len(parsed.prompt) <= limit and len(parsed.negative or "") <= limit
    allowed = {*_CHAT_OPTIONS, *parse.FRONT_END_OPTIONS}
    assert set(parsed.options) <= allowed, parsed.options
    if parse.ASPECT_OPTION in parsed.options:  # what the parser let through is usable
        parse.aspect_to_size(parsed.options[parse.ASPECT_OPTION], 1024 * 1024)


CHAT = Target(
    "chat-command",
    st.tuples(_CHAT_TEXT, st.booleans(), st.booleans(), st.booleans(), st.sampled_from([50, 2000])),
    _chat,
    "telegram/parse.py: a command message into prompt, negative and options",
)


def _aspect(text: str) -> None:
    try:
        width, height = parse.aspect_to_size(text, 1024 * 1024)
    except parse.ParseError:
        return
    assert width >= 16 and height >= 16
    assert max(width / height, height / width) <= parse.MAX_ASPECT * 1.1


ASPECT = Target(
    "aspect-ratio",
    st.one_of(
        st.text(max_size=30),
        st.builds(
            lambda a, sep, b: f"{a}{sep}{b}",
            st.one_of(
                st.integers(-5, 10**30).map(str),
                st.floats(allow_nan=True, allow_infinity=True).map(repr),
            ),
            st.sampled_from([":", "x", "×", "/", " : "]),
            st.one_of(
                st.integers(-5, 10**30).map(str),
                st.floats(allow_nan=True, allow_infinity=True).map(repr),
            ),
        ),
    ),
    _aspect,
    "telegram/parse.py: --ar W:H into a width and a height",
)


# --- option values (the web form, the API's options, the chat's --name value) ----------

_PARAMS = [
    params.Param("steps", "int", (), min=1, max=50),
    params.Param("seed", "seed", ()),
    params.Param("guidance", "float", (), min=0.0, max=30.0, step=0.5),
    params.Param("width", "int", (), min=64, max=2048, step=16),
    params.Param("prompt", "text", (), required=True, max_length=2000),
    params.Param("upscale", "bool", ()),
    params.Param("sampler", "choice", (), choices=("euler", "dpmpp_2m", 3)),
    params.Param("free", "int", ()),
    params.Param("ratio", "float", (), step=0.25),
]
_VALUES = st.one_of(
    st.text(max_size=50),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.integers(-(10**400), 10**400),
    st.just("9" * 5000),
    st.sampled_from(
        [
            "1e400",
            "-1e400",
            "nan",
            "inf",
            "٣",
            "١٢",
            " 4 ",
            "4.0",
            "0x10",
            "1_000",
            "\x00",
            "yes",
            "EULER",
            "euler ",
        ]
    ),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _value(case: tuple[int, Any]) -> None:
    param = _PARAMS[case[0] % len(_PARAMS)]
    try:
        param.convert(case[1])
    except params.ParamError as exc:
        assert str(exc).strip()


VALUES = Target(
    "option-value",
    st.tuples(st.integers(0, len(_PARAMS) - 1), _VALUES),
    _value,
    "comfy/params.py: a value from a form, a JSON body or the chat, checked against a parameter",
)


# --- workflows an operator adds (TOML bindings and an API-format graph) ----------------

_GRAPH = {
    "3": {
        "class_type": "KSampler",
        "inputs": {"seed": 1, "steps": 20, "cfg": 7.0, "model": ["4", 0], "positive": ["6", 0]},
    },
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0]}},
}
_TOML_LINES = [
    'command = "mine"',
    'command = "Bad Name"',
    "command = 3",
    'kind = "video"',
    'kind = "sound"',
    'title = "Mine"',
    'title = { en = "Mine", fa = "مال من" }',
    "spoiler = true",
    "[params.prompt]",
    'type = "text"',
    'target = "6.text"',
    'target = "6"',
    'target = "99.text"',
    'target = ["6.text", "3.seed"]',
    "free_text = true",
    "[params.seed]",
    'type = "seed"',
    'target = "3.seed"',
    "default = 1",
    "default = -1",
    "[params.steps]",
    'type = "int"',
    'target = "3.steps"',
    "min = 1",
    "max = 50",
    "min = 60",
    "step = 0",
    "step = -1",
    'choices = ["a", 1]',
    "choices = []",
    'aliases = ["s", "seed"]',
    "[models]",
    '"checkpoints/a.safetensors" = { size = 1 }',
    "unknown = 1",
    "[params.x]",
    'type = "image"',
    'type = "nope"',
    "max_length = -3",
    "[[params]]",
    "= broken",
    '"\\ud800" = 1',
    "max = 1e400",
    "default = nan",
]


def _graph_text(mutation: tuple[str, Any]) -> str:
    kind, value = mutation
    graph: Any = json.loads(json.dumps(_GRAPH))
    if kind == "replace-node":
        graph["3"] = value
    elif kind == "replace-inputs":
        graph["3"]["inputs"] = value
    elif kind == "replace-graph":
        graph = value
    elif kind == "text":
        return str(value)
    return json.dumps(graph)


_JSON = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_WORKFLOW = st.tuples(
    st.lists(st.one_of(st.sampled_from(_TOML_LINES), st.text(max_size=20)), max_size=16).map(
        "\n".join
    ),
    st.tuples(
        st.sampled_from(["same", "replace-node", "replace-inputs", "replace-graph", "text"]), _JSON
    ),
)


def _workflow(case: tuple[str, tuple[str, Any]]) -> None:
    toml_text, mutation = case
    try:
        bindings.loads("mine", toml_text, _graph_text(mutation))
    except bindings.WorkflowError as exc:
        assert str(exc).strip()


WORKFLOW = Target(
    "workflow-files",
    _WORKFLOW,
    _workflow,
    "comfy/bindings.py: an operator's TOML bindings and API-format JSON graph",
)


# --- images and videos: the checker and the metadata stripper -------------------------


@cache
def seed_files() -> tuple[bytes, ...]:
    """Small real files of every container the parsers meet, metadata included."""
    picture = Image.new("RGB", (24, 16), (200, 30, 40))
    out: list[bytes] = []
    for fmt, extra in (
        ("PNG", {}),
        ("JPEG", {"quality": 80}),
        ("WEBP", {"quality": 80}),
        ("GIF", {}),
    ):
        buffer = io.BytesIO()
        exif = Image.Exif()
        exif[0x0112] = 6  # orientation: turn it, as phones do
        exif[0x010F] = "PhoneMaker"
        kwargs: dict[str, Any] = dict(extra)
        if fmt != "GIF":
            kwargs["exif"] = exif.tobytes()
        picture.save(buffer, fmt, **kwargs)
        out.append(buffer.getvalue())
    out.append(_mp4())
    return tuple(out)


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _mp4() -> bytes:
    comment = _box(b"\xa9cmt", b'{"prompt": "a secret"}')
    udta = _box(b"udta", _box(b"meta", b"\x00" * 4 + _box(b"ilst", comment)))
    trak = _box(b"trak", _box(b"tkhd", b"\x00" * 20))
    moov = _box(b"moov", _box(b"mvhd", b"\x00" * 100) + trak + udta)
    return _box(b"ftyp", b"isom\x00\x00\x02\x00") + _box(b"mdat", b"frames") + moov


def _png_ihdr(width: int, height: int) -> bytes:
    """A PNG header claiming a size, with a valid CRC, and a little data."""
    body = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    ihdr = struct.pack(">I", 13) + body + struct.pack(">I", zlib.crc32(body))
    idat_body = b"IDAT" + zlib.compress(b"\x00" * 64)
    idat = (
        struct.pack(">I", len(idat_body) - 4) + idat_body + struct.pack(">I", zlib.crc32(idat_body))
    )
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat


_MUTATION = st.one_of(
    st.tuples(st.just("cut"), st.integers(0, 4096)),
    st.tuples(st.just("flip"), st.integers(0, 4096), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 4096), st.binary(max_size=16)),
    st.tuples(
        st.just("huge"),
        st.integers(0, 4096),
        st.sampled_from([0xFFFFFFFF, 0x7FFFFFFF, 0x10000, 0, 1, 7, 8, 9]),
    ),
)


def mutate(data: bytes, mutations: list[tuple[Any, ...]]) -> bytes:
    buffer = bytearray(data)
    for mutation in mutations:
        kind, at = mutation[0], mutation[1] % (len(buffer) + 1)
        if kind == "cut":
            del buffer[at:]
        elif kind == "flip" and at < len(buffer):
            buffer[at] = mutation[2]
        elif kind == "insert":
            buffer[at:at] = mutation[2]
        elif kind == "huge":
            buffer[at : at + 4] = struct.pack(">I", mutation[2])
    return bytes(buffer)


_FILES = st.one_of(
    st.tuples(st.integers(0, 4), st.lists(_MUTATION, max_size=4)).map(
        lambda case: mutate(seed_files()[case[0]], case[1])
    ),
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)).map(
        lambda size: _png_ihdr(*size)
    ),
    st.binary(max_size=64),
)
_IMAGE_LIMITS = {"max_bytes": 5 * 1024 * 1024, "max_pixels": 4_000_000}


def _image(data: bytes) -> None:
    try:
        checked = images.check_image(data, **_IMAGE_LIMITS)
    except images.ImageRejected as exc:
        assert str(exc).strip()
        return
    assert checked.pixels <= _IMAGE_LIMITS["max_pixels"]
    assert b"PhoneMaker" not in checked.data, "an accepted image keeps no EXIF"


IMAGE = Target(
    "image-check",
    _FILES,
    _image,
    "images.py: a user's upload decoded, checked against the limits, metadata dropped",
)


def _strip(data: bytes) -> None:
    try:
        stripped = metadata.strip(data)
    except metadata.MetadataError:
        return
    # What comes out is a container the stripper itself accepts, with nothing left to take.
    assert metadata.strip(stripped) == stripped


STRIP = Target(
    "metadata-strip",
    _FILES,
    _strip,
    "metadata.py: PNG, JPEG, WebP and MP4 containers without their metadata",
)


# --- the data of a pressed button (any client can send any data with a press) ---------

_CALLBACK = st.one_of(
    st.text(max_size=70),
    st.builds(
        lambda action, owner, rest: f"{action}{owner}:{rest}",
        st.sampled_from(["again", "cancel", "edit", "file", "set", "forget", "x", ""]),
        st.sampled_from(["", "@1", "@-5", "@x", "@" + "9" * 5000, "@1e3"]),
        st.one_of(
            st.text(max_size=40),
            st.uuids().map(lambda u: u.hex),
            st.uuids().map(lambda u: f"{u.hex}:{2**70}"),
            st.sampled_from(["yes", "no", "lang:fa", "a:b:c", ":"]),
        ),
    ),
)


def _callback(data: str) -> None:
    press = callbacks_data.parse(data)
    if press is not None:
        assert press.action in {"again", "cancel", "edit", "file", "set", "forget"}


CALLBACK = Target(
    "button-data",
    _CALLBACK,
    _callback,
    "telegram/callbacks_data.py: the data of a pressed inline button",
)


# --- getUpdates' answers (Telegram misbehaving, or whatever answers in its place) ------

_MESSAGE = {
    "message_id": 7, "date": 1_760_000_000,
    "chat": {"id": 60, "type": "private", "first_name": "Ann"},
    "from": {"id": 60, "is_bot": False, "first_name": "Ann", "language_code": "fa"},
    "text": "/f a fox --steps 4",
    "entities": [{"type": "bot_command", "offset": 0, "length": 2}],
}
_UPDATE_KEYS = ["update_id", "message", "edited_message", "callback_query", "my_chat_member",
                "message_id", "date", "chat", "from", "text", "entities", "photo", "id",
                "type", "offset", "length", "caption", "reply_to_message", "data"]


def _mutated_update(case: tuple[int, list[tuple[int, str, Any]]]) -> Any:
    update: Any = {"update_id": case[0], "message": json.loads(json.dumps(_MESSAGE))}
    for depth, key, value in case[1]:
        target = update
        for _ in range(depth):  # walk into nested objects as deep as the mutation says
            inner = [v for v in target.values() if isinstance(v, dict)] if isinstance(
                target, dict) else []
            if not inner:
                break
            target = inner[0]
        if isinstance(target, dict):
            target[key] = value
    return update


_ANSWERS = st.lists(
    st.one_of(
        st.tuples(st.integers(1, 2**40), st.lists(st.tuples(st.integers(0, 3),
                                                           st.sampled_from(_UPDATE_KEYS), _JSON),
                                                 max_size=4)).map(_mutated_update),
        _JSON,
    ),
    max_size=5,
).map(lambda result: json.dumps({"ok": True, "result": result}).encode())


def _updates(body: bytes) -> None:
    from telegram import Update

    try:
        cleaned = updates.readable(body)
    except updates.NoUpdateId:
        return  # a network error to PTB: its polling loop waits and asks again
    for update in json.loads(cleaned)["result"]:
        Update.de_json(update, None)  # every update left reads


UPDATES = Target(
    "bot-api-updates",
    _ANSWERS,
    _updates,
    "telegram/updates.py: getUpdates' answer, each update readable by PTB or skipped",
)

PURE_TARGETS = (CHAT, ASPECT, VALUES, WORKFLOW, IMAGE, STRIP, CALLBACK, UPDATES)
