"""Per-run timings measured from a job's WebSocket events as they arrive.

ComfyUI tells us which node starts (`executing`), how far a sampler got (`progress`)
and, with its own clock, when the job started and ended (`execution_start`,
`execution_success` timestamps). A node's time is the gap between its `executing`
event and the next one; cached nodes get no `executing` and so no time. Sampler speed
is steps advanced over the time between the first and the last `progress` event of
the sampler nodes, which leaves out model loading before the first step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from comfyveil.bench import records

Clock = Callable[[], float]


@dataclass
class _Progress:
    first_t: float
    first_value: float
    last_t: float
    last_value: float
    max: float


@dataclass
class RunTimer:
    """Collects one job's events; feed it with `on_event`, read it when the job is done.

    It understands the typed events of `comfyveil.comfy.events` by their class names and
    fields, so it keeps working when the client grows more event types.
    """

    class_types: Mapping[str, str] = field(default_factory=dict)  # node id -> class_type
    clock: Clock = time.monotonic
    start_ms: int | None = None
    end_ms: int | None = None
    cached: set[str] = field(default_factory=set)
    _current: tuple[str, float] | None = None
    _nodes: dict[str, float] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)
    _progress: dict[str, _Progress] = field(default_factory=dict)

    def on_event(self, event: Any) -> None:
        now = self.clock()
        kind = type(event).__name__
        if kind == "ExecutionStart":
            self.start_ms = _timestamp(event)
        elif kind == "ExecutionCached":
            self.cached.update(str(n) for n in getattr(event, "nodes", ()) or ())
        elif kind == "Executing":
            self._close(now)
            node = getattr(event, "node", None)
            if node is not None:
                self._current = (str(node), now)
        elif kind == "Progress":
            self._on_progress(event, now)
        elif kind in {"ExecutionSuccess", "ExecutionError", "ExecutionInterrupted"}:
            self._close(now)
            if kind == "ExecutionSuccess":
                self.end_ms = _timestamp(event)

    def _on_progress(self, event: Any, now: float) -> None:
        node = getattr(event, "node", None)
        if node is None and self._current is not None:
            node = self._current[0]
        if node is None:
            return
        value = float(getattr(event, "value", 0) or 0)
        maximum = float(getattr(event, "max", 0) or 0)
        seen = self._progress.get(str(node))
        if seen is None:
            self._progress[str(node)] = _Progress(now, value, now, value, maximum)
        else:
            seen.last_t, seen.last_value, seen.max = now, value, maximum

    def _close(self, now: float) -> None:
        if self._current is None:
            return
        node, started = self._current
        if node not in self._nodes:
            self._order.append(node)
        self._nodes[node] = self._nodes.get(node, 0.0) + (now - started)
        self._current = None

    @property
    def execution_s(self) -> float | None:
        """The server's execution time from its own timestamps, if both arrived."""
        if self.start_ms is None or self.end_ms is None:
            return None
        return max(0.0, (self.end_ms - self.start_ms) / 1000)

    def nodes(self) -> tuple[records.NodeTime, ...]:
        return tuple(
            records.NodeTime(node, self.class_types.get(node), self._nodes[node])
            for node in self._order
        )

    def sampler_its(self) -> float | None:
        """Sampler iterations per second, or None when no sampler reported progress."""
        samplers = [
            p for node, p in self._progress.items()
            if p.max > 1 and "sampler" in self.class_types.get(node, "sampler").lower()
        ]
        steps = sum(p.last_value - p.first_value for p in samplers)
        span = sum(p.last_t - p.first_t for p in samplers)
        if steps <= 0 or span <= 0:
            return None
        return steps / span


def _timestamp(event: Any) -> int | None:
    value = getattr(event, "timestamp", None)
    return int(value) if isinstance(value, (int, float)) else None
