"""Workflows as chat commands: an API-format ComfyUI graph plus parameter bindings.

A workflow is two files side by side:

- ``NAME.json``: the ComfyUI prompt in API format (what "Export (API)" saves): an object
  mapping node ids to ``{"class_type": ..., "inputs": {...}}``; a link is ``["node_id", slot]``.
- ``NAME.toml``: the bindings, which turn the graph into a command::

    command = "f"                  # chat command, /f (a-z, 0-9, _; at most 32)
    title = "Flux Schnell"
    description = "Text to image in 4 steps"
    kind = "image"                 # image | video
    spoiler = false                # true: results go behind a spoiler (blurred until tapped)

    [params.prompt]
    node = "41"                    # node id in NAME.json
    input = "clip_l"               # input name of that node
    type = "text"                  # text | int | float | seed | image | choice | bool
    required = true
    max_length = 2000
    description = "what to draw"

    [params.steps]
    node = "31"
    input = "steps"
    type = "int"
    default = 4                    # optional: the graph's own value is the default
    min = 1
    max = 8

    [params.image]                 # an input image: uploaded, then its name set here
    node = "10"
    input = "image"
    type = "image"

Keys of a parameter:

- ``node`` + ``input``, or ``targets = [{node = "6", input = "text"}, ...]`` when one value
  feeds several inputs (Flux's ``clip_l`` and ``t5xxl``, or a step count used by two
  samplers). A target must be a widget input (a literal value, not a link).
- ``type``: ``text``, ``int``, ``float``, ``seed`` (an int drawn at random when not given),
  ``image`` (an input image; the front end uploads it and binds the uploaded name),
  ``choice`` (needs ``choices = [...]``) or ``bool``.
- ``required`` (default false), ``default`` (when left out, the value the graph already holds,
  so the template's settings stay the defaults; seeds are drawn, images have none),
  ``min``/``max``/``step`` for int, float and seed (``step`` counts from ``min``, so
  ``min = 256, step = 16`` means multiples of 16: the front end maps an aspect ratio onto
  ``width``/``height`` with it), ``max_length`` for text, ``choices`` for choice,
  ``description`` (one line of help), ``aliases = ["n"]`` (other names for the option).
- ``max_pixels`` and ``max_side`` (image only): the largest size the workflow can use
  the image at, where its graph does not show it (`comfy.fit` reads an
  ``ImageScaleToTotalPixels`` or ``ImageScale`` after the ``LoadImage`` itself): the
  image is scaled down to it before it is uploaded. The user's original is kept.
- ``free_text = true`` marks the text parameter that receives the free text of a command
  (``/f a red fox``); without one, the text parameter named ``prompt`` does.

The title and description may be tables of translations by language code, the default
under ``default`` (or ``en``): ``title.default = "Flux Schnell"``, ``title.fa = "..."``;
a user whose language has none reads the default.

Conventional names, which the front end knows: ``prompt``, ``negative``, ``seed``, ``steps``,
``width``, ``height``, ``image``, and for video ``length`` (frames) and ``fps``.

`validate_graph` and `Workflow.check` compare a graph with a backend's ``/object_info``:
node classes, required inputs, widget values and ranges, and link types. Lists of files
(models, uploaded images) differ per install, so `validate_graph` skips them and
`Workflow.check` reports missing model files on their own.

Loading reads small files synchronously; call it at start-up or through
``asyncio.to_thread``.

This module is the public face of workflows; the work is done in `comfy.bindings`
(loading and finding), `comfy.params` (option values), `comfy.template` (the `Workflow`)
and `comfy.requirements` (what a graph needs from a backend).
"""

from __future__ import annotations

from comfyveil.comfy.bindings import KINDS, WorkflowError, find, load, load_dir, loads, shipped
from comfyveil.comfy.params import PARAM_TYPES, SEED_MAX, Param, ParamError, Target
from comfyveil.comfy.requirements import validate_graph
from comfyveil.comfy.template import Workflow

__all__ = [
    "KINDS",
    "PARAM_TYPES",
    "SEED_MAX",
    "Param",
    "ParamError",
    "Target",
    "Workflow",
    "WorkflowError",
    "find",
    "load",
    "load_dir",
    "loads",
    "shipped",
    "validate_graph",
]
