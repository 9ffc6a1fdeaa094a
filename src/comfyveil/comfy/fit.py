"""The largest size a workflow can use an input image at, read from its graph (pure).

Over a slow link (the Anyone Network moves 2-3 MB/s) a job's time is its bytes, and a
12-megapixel photo sent whole to a workflow that first scales it to 1 megapixel pays for
eleven it throws away. So before an image is uploaded, its size is looked up here:

- from the graph, following the image out of its ``LoadImage``: an
  ``ImageScaleToTotalPixels`` (its ``megapixels``, rounded as ComfyUI rounds it, so the
  pre-scaled image is exactly the size the node would have made and the node then has
  nothing to do; with a newer ComfyUI's ``resolution_steps``, a margin of one step), an
  ``ImageScale`` (its ``width``/``height``), and ``ImageScaleBy``
  factors before either; the size the next node (a ``VAEEncode``, an encoder) sees is
  the size that counts. Where the image reaches any other node at its own size, or the
  mask is used, the graph sets no bound;
- from the parameter's ``max_pixels`` and ``max_side`` in the workflow's TOML, which an
  operator sets for a graph this module cannot read (a custom node that scales).

Several uses of one image: the largest wins. The graph and the TOML together: the
smaller. Never larger than the image itself: nothing is scaled up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from comfyveil.comfy.params import Param
from comfyveil.comfy.requirements import is_link

__all__ = ["Fit", "fit_for"]

Size = tuple[int, int]
_Sizer = Callable[[int, int], Size]
_DEPTH = 16  # scaling nodes followed in a row: a graph is a DAG, this only bounds the walk


@dataclass(frozen=True)
class Fit:
    """How large one input image needs to be; `size` gives it for an image's own size."""

    sizers: tuple[_Sizer, ...] = ()  # the graph's uses; empty: the graph sets no bound
    bounded: bool = False  # the graph bounds every use of the image
    max_pixels: int | None = None  # the TOML's, an operator's
    max_side: int | None = None
    uses_mask: bool = False  # the LoadImage's mask (the alpha channel) is used

    @property
    def limited(self) -> bool:
        return self.bounded or self.max_pixels is not None or self.max_side is not None

    def size(self, width: int, height: int) -> Size:
        """The size to send an image of `width` x `height` at: never larger."""
        w, h = width, height
        if self.bounded and self.sizers:
            sizes = [sizer(width, height) for sizer in self.sizers]
            w = min(width, max(s[0] for s in sizes))
            h = min(height, max(s[1] for s in sizes))
        if self.max_pixels is not None and w * h > self.max_pixels:
            w, h = _scaled(w, h, math.sqrt(self.max_pixels / (w * h)), up=False)
        if self.max_side is not None and max(w, h) > self.max_side:
            w, h = _scaled(w, h, self.max_side / max(w, h), up=False)
        return max(1, min(w, width)), max(1, min(h, height))


def fit_for(graph: Mapping[str, Any], param: Param) -> Fit:
    """How large `param`'s image needs to be in `graph` (the graph as applied, with the
    job's values: a ``megapixels`` option changes it)."""
    sizers: list[_Sizer] = []
    bounded = True
    uses_mask = False
    any_use = False
    for target in param.targets:
        node = graph.get(target.node)
        if node is None or node.get("class_type") != "LoadImage" or target.input != "image":
            bounded = False  # a custom loader: its uses are not ours to read
            continue
        for consumer, input_name, slot in _consumers(graph, target.node):
            any_use = True
            if slot == 1:
                uses_mask = True
                bounded = False
                continue
            sizer = _follow(graph, consumer, input_name, 1.0, _DEPTH)
            if sizer is None:
                bounded = False
            else:
                sizers.append(sizer)
    return Fit(
        sizers=tuple(sizers),
        bounded=bounded and any_use and bool(sizers),
        max_pixels=param.max_pixels,
        max_side=param.max_side,
        uses_mask=uses_mask,
    )


def _consumers(graph: Mapping[str, Any], node_id: str) -> list[tuple[str, str, int]]:
    """(node, input, output slot) of every input linked to `node_id`'s outputs."""
    found = []
    for other_id, node in graph.items():
        for name, value in (node.get("inputs") or {}).items():
            if is_link(value) and value[0] == node_id:
                found.append((other_id, name, value[1]))
    return found


def _follow(
    graph: Mapping[str, Any], node_id: str, input_name: str, factor: float, depth: int
) -> _Sizer | None:
    """The size `node_id` needs the image at, the image having been scaled by `factor`
    on its way there; None when the node uses it at whatever size it comes."""
    node = graph[node_id]
    kind = node.get("class_type")
    inputs = node.get("inputs") or {}
    if input_name != "image" or depth <= 0:
        return None
    if kind == "ImageScaleToTotalPixels":
        megapixels = _number(inputs.get("megapixels"))
        if megapixels is None or megapixels <= 0:
            return None
        total = int(megapixels * 1024 * 1024)  # as ComfyUI computes it
        steps = _number(inputs.get("resolution_steps", 1))
        if steps is None or steps < 1:
            return None
        if factor == 1.0 and steps == 1:
            return lambda w, h: _total_pixels(w, h, total)
        # Sides rounded to multiples of `steps` (newer ComfyUI): up to that much larger.
        margin = int(steps) if steps > 1 else 0
        return lambda w, h: _grown(_scaled(w, h, math.sqrt(total / (w * h)) / factor), margin)
    if kind == "ImageScale":
        width, height = _number(inputs.get("width")), _number(inputs.get("height"))
        if width is None or height is None or width < 0 or height < 0:
            return None
        if width == 0 and height == 0:  # ComfyUI passes the image through unchanged
            return _after(graph, node_id, factor, depth)
        return _box(int(width), int(height), factor)
    if kind == "ImageScaleBy":
        scale = _number(inputs.get("scale_by"))
        if scale is None or scale <= 0:
            return None
        return _after(graph, node_id, factor * scale, depth)
    return None


def _after(graph: Mapping[str, Any], node_id: str, factor: float, depth: int) -> _Sizer | None:
    """The largest size the nodes after `node_id` need; None when one takes any size."""
    uses = _consumers(graph, node_id)
    sizers = []
    for consumer, input_name, _slot in uses:
        sizer = _follow(graph, consumer, input_name, factor, depth - 1)
        if sizer is None:
            return None
        sizers.append(sizer)
    if not sizers:
        return None

    def largest(w: int, h: int) -> Size:
        sizes = [s(w, h) for s in sizers]
        return max(s[0] for s in sizes), max(s[1] for s in sizes)

    return largest


def _box(width: int, height: int, factor: float) -> _Sizer:
    """ImageScale: to `width` x `height`; a 0 keeps the aspect, as ComfyUI computes it."""

    def size(w: int, h: int) -> Size:
        if factor == 1.0 and width == 0:
            return max(1, round(w * height / h)), height
        if factor == 1.0 and height == 0:
            return width, max(1, round(h * width / w))
        # Both given (stretched or cropped there): large enough to cover the box.
        scale = max(width / w if width else 0.0, height / h if height else 0.0)
        return _scaled(w, h, scale / factor)

    return size


def _grown(size: Size, margin: int) -> Size:
    return size[0] + margin, size[1] + margin


def _total_pixels(w: int, h: int, total: int) -> Size:
    """ImageScaleToTotalPixels's own rounding (ComfyUI 0.3.x)."""
    scale = math.sqrt(total / (w * h))
    return max(1, round(w * scale)), max(1, round(h * scale))


def _scaled(w: int, h: int, scale: float, *, up: bool = True) -> Size:
    """`w` x `h` times `scale`, rounded up (so no use gets less than it asked for), or
    down (`up=False`, for a limit that must not be passed)."""
    rounding = math.ceil if up else math.floor
    return max(1, int(rounding(w * scale - 1e-9 if up else w * scale + 1e-9))), max(
        1, int(rounding(h * scale - 1e-9 if up else h * scale + 1e-9))
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None  # a link: set at run time by another node, unknown here
    return float(value)
