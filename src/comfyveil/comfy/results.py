"""What a prompt came to: the records a backend answers with, and the folding of one
prompt's events (live, or replayed from its history entry) into a `RunResult`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from comfyveil.comfy import errors, events

__all__ = [
    "OutputFile",
    "ProgressSample",
    "QueueItem",
    "QueueState",
    "RunResult",
    "Submitted",
    "Timings",
    "UploadedFile",
]

_VIDEO_EXT = {".mp4", ".webm", ".mov", ".mkv", ".avi", ".gif"}
_IMAGE_EXT = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"}


# --- records ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submitted:
    prompt_id: str
    number: float
    node_errors: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OutputFile:
    node_id: str
    filename: str
    subfolder: str
    type: str
    kind: Literal["image", "video", "other"]

    @classmethod
    def classify(cls, node_id: str, item: Mapping[str, Any]) -> OutputFile:
        filename = str(item.get("filename", ""))
        ext = PurePosixPath(filename).suffix.lower()
        kind: Literal["image", "video", "other"] = (
            "video" if ext in _VIDEO_EXT else "image" if ext in _IMAGE_EXT else "other"
        )
        return cls(
            node_id=node_id,
            filename=filename,
            subfolder=str(item.get("subfolder") or ""),
            type=str(item.get("type") or "output"),
            kind=kind,
        )


@dataclass(frozen=True, slots=True)
class UploadedFile:
    name: str
    subfolder: str
    type: str

    @property
    def reference(self) -> str:
        """The value to put in a LoadImage `image` input."""
        return f"{self.subfolder}/{self.name}" if self.subfolder else self.name


@dataclass(frozen=True, slots=True)
class QueueItem:
    number: float
    prompt_id: str
    prompt: Mapping[str, Any] = field(repr=False)
    extra_data: Mapping[str, Any] = field(repr=False)
    outputs_to_execute: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueState:
    running: tuple[QueueItem, ...]
    pending: tuple[QueueItem, ...]  # in execution order (sorted by number)

    def position(self, prompt_id: str) -> int | None:
        """0 = running, 1 = next to run, ...; None = not in the queue."""
        if any(item.prompt_id == prompt_id for item in self.running):
            return 0
        for index, item in enumerate(self.pending, start=1):
            if item.prompt_id == prompt_id:
                return index
        return None


@dataclass(frozen=True, slots=True)
class ProgressSample:
    at: float  # time.monotonic() seconds
    node: str | None
    value: float
    max: float


@dataclass(frozen=True, slots=True)
class Timings:
    execution_start_ms: int | None = None
    execution_end_ms: int | None = None
    node_ms: Mapping[str, float] = field(default_factory=dict)  # cached nodes: 0
    cached_nodes: tuple[str, ...] = ()
    progress: tuple[ProgressSample, ...] = ()

    @property
    def duration_ms(self) -> int | None:
        if self.execution_start_ms is None or self.execution_end_ms is None:
            return None
        return self.execution_end_ms - self.execution_start_ms

    def iterations_per_second(self, node: str | None = None) -> float | None:
        """Rate of progress steps of one node (default: the one with most samples)."""
        by_node: dict[str | None, list[ProgressSample]] = {}
        for sample in self.progress:
            by_node.setdefault(sample.node, []).append(sample)
        if not by_node:
            return None
        if node is None:
            node = max(by_node, key=lambda k: len(by_node[k]))
        samples = by_node.get(node) or []
        if len(samples) < 2:
            return None
        steps = samples[-1].value - samples[0].value
        elapsed = samples[-1].at - samples[0].at
        return steps / elapsed if elapsed > 0 and steps > 0 else None


@dataclass(frozen=True, slots=True)
class RunResult:
    prompt_id: str
    backend: str
    status: Literal["success", "error", "interrupted"]
    outputs: tuple[OutputFile, ...] = ()
    ui: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # node -> raw output
    error: events.ExecutionError | None = None
    interruption: events.ExecutionInterrupted | None = None
    timings: Timings = field(default_factory=Timings)

    def raise_for_status(self) -> RunResult:
        """Return self on success; raise ExecutionFailed or Interrupted otherwise."""
        if self.status == "interrupted":
            info = self.interruption
            raise errors.Interrupted(
                backend=self.backend,
                prompt_id=self.prompt_id,
                node_id=info.node_id if info else None,
                node_type=info.node_type if info else None,
            )
        if self.status == "error":
            err = self.error
            raise errors.ExecutionFailed(
                backend=self.backend,
                prompt_id=self.prompt_id,
                node_id=err.node_id if err else None,
                node_type=err.node_type if err else None,
                exception_type=err.exception_type if err else None,
                exception_message=err.exception_message if err else "",
            )
        return self


# --- event tracking -------------------------------------------------------------------


class Tracker:
    """Folds the events of one prompt into a RunResult."""

    def __init__(self, prompt_id: str, backend: str) -> None:
        self.prompt_id = prompt_id
        self.backend = backend
        self.started = False
        self.start_ms: int | None = None
        self.end_ms: int | None = None
        self.cached: tuple[str, ...] = ()
        self.node_ms: dict[str, float] = {}
        self.progress: list[ProgressSample] = []
        self.ui: dict[str, dict[str, Any]] = {}
        self.error: events.ExecutionError | None = None
        self.interruption: events.ExecutionInterrupted | None = None
        self.success = False
        self.done = False
        self._current: tuple[str, float] | None = None

    def _close_node(self, now: float) -> None:
        if self._current is not None:
            node, since = self._current
            self.node_ms[node] = self.node_ms.get(node, 0.0) + (now - since) * 1000.0
            self._current = None

    def feed(self, event: events.Event, now: float | None = None) -> None:
        """Fold one event in; `now` is when it arrived (monotonic), so node times do not
        depend on how quickly the consumer got round to it."""
        now = time.monotonic() if now is None else now
        match event:
            case events.ExecutionStart():
                self.started = True
                self.start_ms = event.timestamp
            case events.ExecutionCached():
                self.started = True
                self.cached = event.nodes
                for node in event.nodes:
                    self.node_ms.setdefault(node, 0.0)
            case events.Executing(node=None):
                self._close_node(now)
                if event.prompt_id == self.prompt_id:
                    self.done = True
            case events.Executing():
                self.started = True
                self._close_node(now)
                assert event.node is not None
                self._current = (event.node, now)
            case events.Executed():
                self.ui[event.node] = dict(event.output)
                if self._current and self._current[0] == event.node:
                    self._close_node(now)
                self.node_ms.setdefault(event.node, 0.0)
            case events.ProgressState():
                if self._current is not None:
                    state = event.nodes.get(self._current[0])
                    if state is not None and state.state == "finished":
                        self._close_node(now)
            case events.Progress():
                self.progress.append(ProgressSample(now, event.node, event.value, event.max))
            case events.ExecutionSuccess():
                self._close_node(now)
                self.success = True
                self.end_ms = event.timestamp
            case events.ExecutionError():
                self._close_node(now)
                self.error = event
                self.end_ms = event.timestamp
            case events.ExecutionInterrupted():
                self._close_node(now)
                self.interruption = event
                self.end_ms = event.timestamp
            case _:
                pass

    def result(self) -> RunResult:
        status: Literal["success", "error", "interrupted"] = (
            "interrupted" if self.interruption else "error" if self.error else "success"
        )
        outputs = tuple(
            OutputFile.classify(node, item)
            for node, ui in self.ui.items()
            for item in ui.get("images") or ui.get("gifs") or ui.get("videos") or ()
            if isinstance(item, Mapping) and item.get("filename")
        )
        return RunResult(
            prompt_id=self.prompt_id,
            backend=self.backend,
            status=status,
            outputs=outputs,
            ui=self.ui,
            error=self.error,
            interruption=self.interruption,
            timings=Timings(
                execution_start_ms=self.start_ms,
                execution_end_ms=self.end_ms,
                node_ms=dict(self.node_ms),
                cached_nodes=self.cached,
                progress=tuple(self.progress),
            ),
        )


def result_from_history(prompt_id: str, backend: str, entry: Mapping[str, Any]) -> RunResult | None:
    """A RunResult from a finished history entry; None while it is not finished."""
    status = entry.get("status") or {}
    messages = status.get("messages") or []
    tracker = Tracker(prompt_id, backend)
    finished = bool(status.get("completed"))
    for message in messages:
        if isinstance(message, list | tuple) and len(message) == 2:
            event = events.parse_message({"type": message[0], "data": message[1]})
            tracker.feed(event)
            if isinstance(
                event,
                events.ExecutionSuccess | events.ExecutionError | events.ExecutionInterrupted,
            ):
                finished = True
    if not finished and status.get("status_str") not in ("success", "error"):
        return None
    for node, output in (entry.get("outputs") or {}).items():
        if isinstance(output, Mapping):
            tracker.ui[str(node)] = dict(output)
    if status.get("status_str") == "error" and not (tracker.error or tracker.interruption):
        tracker.error = events.ExecutionError(
            prompt_id, None, None, "the backend reported an error", None
        )
    return tracker.result()


def queue_item(raw: Any) -> QueueItem:
    number, prompt_id, prompt, extra, outputs = raw[:5]
    return QueueItem(
        number=float(number),
        prompt_id=str(prompt_id),
        prompt=prompt if isinstance(prompt, Mapping) else {},
        extra_data=extra if isinstance(extra, Mapping) else {},
        outputs_to_execute=tuple(str(o) for o in outputs or ()),
    )
