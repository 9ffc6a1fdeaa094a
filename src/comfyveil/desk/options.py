"""A command's options given by name (``{"steps": 4, "ar": "16:9"}``), as a front end that
takes them as data rather than typed text reads them (the jobs API): the same names,
aliases, bounds and sentences as the chat's ``--steps 4 --ar 16:9`` and the web form, and
the same rule for an aspect ratio (a size of about the workflow's own pixel count, in its
multiples, within its bounds).

The aspect rule lives here alone: the chat's ``--ar`` and its /settings call
:func:`parse_aspect` and :func:`size_for` too, so every front end reads a ratio the same.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from comfyveil import errors
from comfyveil.comfy import workflow
from comfyveil.desk import registry
from comfyveil.desk.submit import IMAGE_PLACEHOLDER
from comfyveil.i18n import N_, _, ltr

ASPECT_OPTION = "ar"
NEGATIVE_OPTION = "negative"
MAX_ASPECT = 4.0  # wider or taller than 4:1 makes broken images on every model we ship
DEFAULT_PIXELS = 1024 * 1024
_ASPECT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*[:x×/]\s*(\d+(?:\.\d+)?)\s*$")


class OptionError(errors.UsageError):
    """That option is not valid."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def parse_aspect(ar: str) -> tuple[float, float]:
    """Read ``W:H`` (also ``WxH``, ``W/H``); refuse ratios beyond 4:1.

    Raises:
        OptionError: not a ratio, or too extreme.
    """
    match = _ASPECT.match(ar)
    if match is None:
        raise OptionError(
            _("The aspect ratio {ratio} is not valid; write it like {example}.").format(
                ratio=ltr(repr(ar[:20])), example=ltr("16:9")
            ),
            param=ASPECT_OPTION,
        )
    width, height = float(match.group(1)), float(match.group(2))
    if width <= 0 or height <= 0:
        raise OptionError(
            _("An aspect ratio needs two numbers above zero, like {example}.").format(
                example=ltr("16:9")
            ),
            param=ASPECT_OPTION,
        )
    if max(width / height, height / width) > MAX_ASPECT:
        raise OptionError(
            _("The aspect ratio {ratio} is too extreme; use one between {low} and {high}.").format(
                ratio=ltr(f"{match.group(1)}:{match.group(2)}"), low=ltr("1:4"), high=ltr("4:1")
            ),
            param=ASPECT_OPTION,
        )
    return width, height


def aspect_to_size(ar: str, base_pixels: int, multiple: int = 16) -> tuple[int, int]:
    """Width and height for aspect ratio ``ar`` with about ``base_pixels`` pixels.

    Both sides are multiples of ``multiple`` (latent models need it), e.g. 16:9 at
    1024*1024 pixels gives (1360, 768).

    Raises:
        OptionError: when ``ar`` is not a ratio or is beyond 4:1.
    """
    width, height = parse_aspect(ar)
    ratio = width / height
    w = math.sqrt(base_pixels * ratio)
    h = math.sqrt(base_pixels / ratio)
    return (
        max(multiple, round(w / multiple) * multiple),
        max(multiple, round(h / multiple) * multiple),
    )


def clamp(value: int, param: workflow.Param) -> int:
    """`value` within the parameter's bounds, on its step."""
    low = int(param.min) if param.min is not None else value
    high = int(param.max) if param.max is not None else value
    value = min(max(value, low), high)
    if param.step:
        step = int(param.step)
        base = low if param.min is not None else 0
        value = base + round((value - base) / step) * step
        while param.max is not None and value > param.max:
            value -= step
    return value


RATIO_TOLERANCE = 1.1  # sides are rounded to the workflow's step: near is as asked
RATIO_DOES_NOT_FIT = N_(
    "The aspect ratio {ratio} does not fit the sizes {command} can make "
    "(width {width}, height {height}); choose a less extreme one."
)


def _bounds(param: workflow.Param) -> str:
    low = int(param.min) if param.min is not None else None
    high = int(param.max) if param.max is not None else None
    if low is not None and high is not None:
        return f"{low}-{high}"
    return f"≥{low}" if low is not None else f"≤{high}" if high is not None else "any"


def size_for(wf: workflow.Workflow, ar: str) -> tuple[int, int]:
    """Width and height for aspect ratio `ar`, about as many pixels as the default size.

    Raises:
        OptionError: not a ratio, too extreme, or no size within the bounds keeps it.
    """
    width_p, height_p = wf.params["width"], wf.params["height"]
    w0, h0 = registry.graph_value(wf, "width"), registry.graph_value(wf, "height")
    pixels = DEFAULT_PIXELS
    if isinstance(w0, int) and isinstance(h0, int) and w0 > 0 and h0 > 0:
        pixels = w0 * h0
    multiple = int(width_p.step or 16)
    width, height = aspect_to_size(ar, pixels, multiple)
    wanted = width / height
    # A side beyond its bounds moves both sides, so the picture keeps the ratio asked for
    # (21:9 with a 64 px minimum height is 152x64, not 96x64).
    w, h = float(width), float(height)
    if width_p.max is not None and w > width_p.max:
        w, h = float(width_p.max), float(width_p.max) / wanted
    if height_p.max is not None and h > height_p.max:
        w, h = float(height_p.max) * wanted, float(height_p.max)
    if width_p.min is not None and w < width_p.min:
        w, h = float(width_p.min), float(width_p.min) / wanted
    if height_p.min is not None and h < height_p.min:
        w, h = float(height_p.min) * wanted, float(height_p.min)
    fitted = clamp(round(w), width_p), clamp(round(h), height_p)
    got = fitted[0] / fitted[1]
    if max(got / wanted, wanted / got) > RATIO_TOLERANCE:
        raise OptionError(
            _(RATIO_DOES_NOT_FIT).format(
                ratio=ltr(ar),
                command=ltr(f"/{wf.command}"),
                width=ltr(_bounds(width_p)),
                height=ltr(_bounds(height_p)),
            ),
            param=ASPECT_OPTION,
        )
    return fitted


def values_for(
    entry: registry.Entry,
    prompt: str | None,
    options: Mapping[str, object],
) -> dict[str, object]:
    """The workflow's values from a prompt and options by name, before validation (the
    desk's `submit.queue` validates them, bounds and all).

    Raises:
        OptionError: an option the command does not take, an aspect ratio for a command
            without a size, a prompt for one that takes none, or none for one that needs it.
        ParamError: an unknown option (with the list of those it takes).
    """
    wf = entry.workflow
    command = ltr(f"/{entry.name}")
    values: dict[str, object] = {}
    aspect: object = None
    skip = {wf.prompt_param, *wf.image_params}
    for key, value in options.items():
        if key == ASPECT_OPTION:
            aspect = value
            continue
        name = wf.param(key).name  # ParamError for an unknown option, listing them
        if name in skip:
            raise OptionError(
                _("{command} has no option {option}. Allowed: {allowed}.").format(
                    command=command,
                    option=ltr(key),
                    allowed=", ".join([*sorted(entry.options), ASPECT_OPTION]),
                ),
                param=key,
            )
        values[name] = value
    if aspect is not None:
        if "width" not in wf.params or "height" not in wf.params:
            raise OptionError(
                _("{command} has no width and height, so {ar} cannot be used.").format(
                    command=command, ar=ltr(ASPECT_OPTION)
                ),
                param=ASPECT_OPTION,
            )
        if not isinstance(aspect, str):
            raise OptionError(
                _("The aspect ratio {ratio} is not valid; write it like {example}.").format(
                    ratio=ltr(repr(str(aspect)[:20])), example=ltr("16:9")
                ),
                param=ASPECT_OPTION,
            )
        if not {"width", "height"} & set(values):
            values["width"], values["height"] = size_for(wf, aspect)
    if wf.prompt_param is not None:
        if prompt is not None:
            values[wf.prompt_param] = prompt
    elif prompt:
        raise OptionError(
            _("{command} takes no words, only its options: {words} would be lost.").format(
                command=command, words=ltr(repr(prompt[:40]))
            ),
            param="prompt",
        )
    for name in wf.image_params:
        values[name] = IMAGE_PLACEHOLDER
    return values
