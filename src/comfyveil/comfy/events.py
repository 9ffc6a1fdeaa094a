"""ComfyUI WebSocket messages, parsed into typed records at the boundary.

Text frames are JSON `{"type": ..., "data": {...}}`; binary frames start with a
big-endian u32 event type (see notes/comfyui-api.md §8). Unknown types become
`Unknown` so a newer server never breaks a client. `QueuePosition` is not a wire
message: the client synthesises it while a job waits.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from comfyveil.comfy import errors

__all__ = [
    "Event",
    "Executed",
    "Executing",
    "ExecutionCached",
    "ExecutionError",
    "ExecutionInterrupted",
    "ExecutionStart",
    "ExecutionSuccess",
    "FeatureFlags",
    "NodeProgress",
    "Preview",
    "Progress",
    "ProgressState",
    "QueuePosition",
    "Status",
    "Text",
    "Unknown",
    "parse_binary",
    "parse_text",
]

PREVIEW_IMAGE = 1
UNENCODED_PREVIEW_IMAGE = 2
TEXT = 3
PREVIEW_IMAGE_WITH_METADATA = 4

_IMAGE_TYPES = {1: "image/jpeg", 2: "image/png"}


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event. `prompt_id` is None where the server sends none."""

    prompt_id: str | None


@dataclass(frozen=True, slots=True)
class Status(Event):
    queue_remaining: int
    sid: str | None = None


@dataclass(frozen=True, slots=True)
class FeatureFlags(Event):
    flags: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ExecutionStart(Event):
    timestamp: int | None


@dataclass(frozen=True, slots=True)
class ExecutionCached(Event):
    nodes: tuple[str, ...]
    timestamp: int | None


@dataclass(frozen=True, slots=True)
class Executing(Event):
    """`node` None (with a prompt_id) means the job is finished."""

    node: str | None
    display_node: str | None = None


@dataclass(frozen=True, slots=True)
class Progress(Event):
    node: str | None
    value: float
    max: float


@dataclass(frozen=True, slots=True)
class NodeProgress:
    node_id: str
    value: float
    max: float
    state: str
    display_node_id: str | None = None
    parent_node_id: str | None = None
    real_node_id: str | None = None


@dataclass(frozen=True, slots=True)
class ProgressState(Event):
    nodes: Mapping[str, NodeProgress]


@dataclass(frozen=True, slots=True)
class Executed(Event):
    node: str
    display_node: str | None
    output: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ExecutionSuccess(Event):
    timestamp: int | None


@dataclass(frozen=True, slots=True)
class ExecutionError(Event):
    """`current_inputs` is dropped on purpose: it holds large tensor reprs."""

    node_id: str | None
    node_type: str | None
    exception_message: str
    exception_type: str | None
    traceback: tuple[str, ...] = ()
    executed: tuple[str, ...] = ()
    timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class ExecutionInterrupted(Event):
    node_id: str | None
    node_type: str | None
    executed: tuple[str, ...] = ()
    timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class Preview(Event):
    """A preview image: a binary frame of type 1 (legacy) or 4 (with metadata)."""

    image: bytes = field(repr=False)
    mime: str
    node_id: str | None = None
    display_node_id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Text(Event):
    node_id: str
    text: str


@dataclass(frozen=True, slots=True)
class QueuePosition(Event):
    """Synthesised by the client: 0 = running, 1 = next, ..."""

    position: int


@dataclass(frozen=True, slots=True)
class Unknown(Event):
    """A message of a type this client does not know; `raw` is kept as received."""

    type: str
    raw: Any = field(repr=False)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(str(v) for v in value)


def parse_text(text: str) -> Event:
    """Parse one JSON text frame. Raises BackendProtocolError if it is not JSON."""
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise errors.BackendProtocolError("the backend sent a message that is not JSON") from exc
    return parse_message(message)


def parse_message(message: Any) -> Event:
    """Parse an already decoded `{"type", "data"}` message."""
    if not isinstance(message, Mapping) or not isinstance(message.get("type"), str):
        return Unknown(prompt_id=None, type="", raw=message)
    kind: str = message["type"]
    data = message.get("data")
    if not isinstance(data, Mapping):
        return Unknown(prompt_id=None, type=kind, raw=message)
    pid = _str(data.get("prompt_id"))
    try:
        return _PARSERS[kind](pid, data) if kind in _PARSERS else Unknown(pid, kind, message)
    except (TypeError, ValueError, KeyError) as exc:
        raise errors.BackendProtocolError(
            f"the backend sent a malformed {kind} message"
        ) from exc


def _status(pid: str | None, data: Mapping[str, Any]) -> Event:
    exec_info = (data.get("status") or {}).get("exec_info") or {}
    return Status(pid, int(exec_info.get("queue_remaining", 0)), _str(data.get("sid")))


def _progress_state(pid: str | None, data: Mapping[str, Any]) -> Event:
    nodes: dict[str, NodeProgress] = {}
    for key, item in (data.get("nodes") or {}).items():
        nodes[str(key)] = NodeProgress(
            node_id=str(item.get("node_id", key)),
            value=float(item.get("value", 0)),
            max=float(item.get("max", 1)),
            state=str(item.get("state", "")),
            display_node_id=_str(item.get("display_node_id")),
            parent_node_id=_str(item.get("parent_node_id")),
            real_node_id=_str(item.get("real_node_id")),
        )
    return ProgressState(pid, nodes)


_PARSERS: dict[str, Any] = {
    "status": _status,
    "feature_flags": lambda pid, d: FeatureFlags(pid, dict(d)),
    "execution_start": lambda pid, d: ExecutionStart(pid, _int(d.get("timestamp"))),
    "execution_cached": lambda pid, d: ExecutionCached(
        pid, _ids(d.get("nodes")), _int(d.get("timestamp"))
    ),
    "executing": lambda pid, d: Executing(
        pid, _str(d.get("node")), _str(d.get("display_node"))
    ),
    "progress": lambda pid, d: Progress(
        pid, _str(d.get("node")), float(d["value"]), float(d["max"])
    ),
    "progress_state": _progress_state,
    "executed": lambda pid, d: Executed(
        pid, str(d["node"]), _str(d.get("display_node")), dict(d.get("output") or {})
    ),
    "execution_success": lambda pid, d: ExecutionSuccess(pid, _int(d.get("timestamp"))),
    "execution_error": lambda pid, d: ExecutionError(
        pid,
        node_id=_str(d.get("node_id")),
        node_type=_str(d.get("node_type")),
        exception_message=str(d.get("exception_message") or ""),
        exception_type=_str(d.get("exception_type")),
        traceback=_ids(d.get("traceback")),
        executed=_ids(d.get("executed")),
        timestamp=_int(d.get("timestamp")),
    ),
    "execution_interrupted": lambda pid, d: ExecutionInterrupted(
        pid,
        node_id=_str(d.get("node_id")),
        node_type=_str(d.get("node_type")),
        executed=_ids(d.get("executed")),
        timestamp=_int(d.get("timestamp")),
    ),
}


def parse_binary(frame: bytes) -> Event:
    """Parse one binary frame; unknown or truncated frames become `Unknown`."""
    if len(frame) < 4:
        return Unknown(None, "binary", frame)
    (kind,) = struct.unpack(">I", frame[:4])
    if kind == PREVIEW_IMAGE and len(frame) >= 8:
        (image_type,) = struct.unpack(">I", frame[4:8])
        mime = _IMAGE_TYPES.get(image_type, "application/octet-stream")
        return Preview(None, image=frame[8:], mime=mime)
    if kind == PREVIEW_IMAGE_WITH_METADATA and len(frame) >= 8:
        (length,) = struct.unpack(">I", frame[4:8])
        if len(frame) >= 8 + length:
            try:
                meta = json.loads(frame[8 : 8 + length])
            except ValueError:
                meta = None
            if isinstance(meta, Mapping):
                return Preview(
                    _str(meta.get("prompt_id")),
                    image=frame[8 + length :],
                    mime=str(meta.get("image_type") or "application/octet-stream"),
                    node_id=_str(meta.get("node_id")),
                    display_node_id=_str(meta.get("display_node_id")),
                    metadata=dict(meta),
                )
    if kind == TEXT and len(frame) >= 8:
        (length,) = struct.unpack(">I", frame[4:8])
        if len(frame) >= 8 + length:
            try:
                node = frame[8 : 8 + length].decode()
                text = frame[8 + length :].decode()
            except UnicodeDecodeError:
                return Unknown(None, f"binary:{kind}", frame)
            return Text(None, node_id=node, text=text)
    return Unknown(None, f"binary:{kind}", frame)


def encode_binary(kind: int, payload: bytes) -> bytes:
    """Build a binary frame (used by the fake server and tests)."""
    return struct.pack(">I", kind) + payload
