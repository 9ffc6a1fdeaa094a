"""What `generate`, `submit` and `bench` share: the arguments that describe one workflow
run, and turning them into parameter values and checked input images."""

from __future__ import annotations

import argparse
import math
import os
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


def add_out(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, default=Path(), metavar="DIR",
        help="save the outputs into DIR, created when missing (default: the current "
        "folder); each saved path is printed on its own line",
    )


def check_out(path: Path) -> None:
    """Refuse an --out that cannot become a folder we may write into, before the job runs
    (a GPU's work is not spent on files that cannot be saved). Blocking, but small."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path} is a file, not a folder")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--out {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out {path}: {existing} is not writable")


def check_timeout(seconds: float) -> None:
    # 0 or less would time out at once and blame whatever step came first (the upload).
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError("--timeout must be more than 0 seconds")
