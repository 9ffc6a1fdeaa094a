"""A run's progress as one status line on a terminal (`comfyveil generate`), and which
progress events are steps a user can read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from comfyveil.comfy import events


def shows_steps(event: events.Progress, node_types: Mapping[str, str]) -> bool:
    """Whether a progress event is a step users can read (a sampler's 9/20), not a saver
    or preview node ticking once per image as it sends it ("SaveImage step 0/1")."""
    kind = node_types.get(event.node or "", "")
    return event.max > 1 and not kind.startswith(("Save", "Preview"))


class ProgressPrinter:
    """One status line on a terminal (stderr), rewritten as events arrive."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._last = ""
        self._node_types: dict[str, str] = {}

    def set_graph(self, graph: Mapping[str, Any]) -> None:
        self._node_types = {k: str(v.get("class_type", "")) for k, v in graph.items()}

    def _show(self, text: str) -> None:
        if text == self._last:
            return
        self._last = text
        if self._tty:
            self._stream.write("\r\x1b[2K" + text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.QueuePosition):
            where = "running" if event.position == 0 else f"queued #{event.position}"
            self._show(where)
        elif isinstance(event, events.ExecutionStart):
            self._show("started")
        elif isinstance(event, events.Executing) and event.node is not None:
            kind = self._node_types.get(event.node, "")
            self._show(f"node {event.node} {kind}".rstrip())
        elif isinstance(event, events.Progress) and shows_steps(event, self._node_types):
            kind = self._node_types.get(event.node or "", "")
            percent = 100 * event.value / event.max
            self._show(f"{kind or 'node'} step {event.value:g}/{event.max:g} ({percent:.0f}%)")
        elif isinstance(event, events.ExecutionSuccess):
            self._show("done")

    def close(self) -> None:
        if self._tty and self._last:
            self._stream.write("\n")
            self._stream.flush()
