"""What `generate`, `submit` and `bench` share: the arguments that describe one workflow
run, and turning them into parameter values and checked input images."""

from __future__ import annotations

import argparse
from pathlib import Path

from comfyveil import config, images
from comfyveil.errors import UsageError


def add_workflow_run(parser: argparse.ArgumentParser) -> None:
    """WORKFLOW PROMPT... [--image FILE]... [--set NAME=VALUE]..."""
    parser.add_argument("workflow", metavar="WORKFLOW")
    parser.add_argument("prompt", metavar="PROMPT", nargs="*", help="the prompt text")
    add_images_and_values(parser)


def add_images_and_values(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--image", action="append", default=[], type=Path, metavar="FILE",
        help="an input image, for workflows that take one (repeat for several)",
    )
    parser.add_argument(
        "--set", action="append", default=[], dest="values", metavar="NAME=VALUE",
        help="set a workflow parameter, e.g. --set steps=4 (repeatable)",
    )


def parse_assignments(pairs: list[str]) -> dict[str, str]:
    """Turn ["steps=4", "seed=1"] into {"steps": "4", "seed": "1"}."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--set needs NAME=VALUE, got {pair!r}")
        values[name.strip()] = value
    return values


def read_image(path: Path, settings: config.Settings) -> images.CheckedImage:
    """Read an --image file and check it is a real image within the limits. Blocking."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return images.check_image(
            data,
            max_bytes=settings.limits.max_image_bytes,
            max_pixels=settings.limits.max_image_pixels,
        )
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from exc
