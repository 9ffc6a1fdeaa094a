"""How much a backend may make us read: every answer, message and output has a cap.

A GPU host can be compromised, or sit behind a tampering proxy. Whatever it sends is
read up to a limit and then refused, so it can cost a bounded amount of memory and
time, never the bot's whole process.
"""

from __future__ import annotations

from dataclasses import dataclass

from comfyveil import config

MIB = 1024 * 1024

# The defaults live in config (a lower floor, which must not import this one).
DEFAULT_MAX_OUTPUT_BYTES = config.DEFAULT_MAX_OUTPUT_BYTES
DEFAULT_MAX_OUTPUTS = config.DEFAULT_MAX_OUTPUTS
# A JSON answer (history, queue, prompt, upload): a history entry holds the whole graph
# and, for a failed node, the repr of its inputs; 16 MiB is thousands of times that.
JSON_ANSWER_BYTES = 16 * MIB
# /object_info: 0.5 MB on a plain ComfyUI, several MB with many custom node packs.
# (Parsed JSON costs 6 to 20 times its size in memory: these caps bound that too.)
OBJECT_INFO_BYTES = 32 * MIB
# A WebSocket text message is an event (a few KB; an execution error with its inputs'
# repr a few hundred KB). Binary frames carry previews and SaveImageWebsocket images,
# so theirs follows max_output_bytes, plus room for the frame's header and metadata.
WS_TEXT_BYTES = 4 * MIB
WS_BINARY_MARGIN = 4 * MIB
STREAM_CHUNK = 1 << 20  # bytes handed on at a time from a downloading output
UPLOAD_CHUNK = 1 << 16  # bytes written at a time, each within the inactivity timeout


@dataclass(frozen=True, slots=True)
class Limits:
    """What one job may bring back from a backend, and the largest input image it decodes
    to scale it down before the upload (a larger one goes as it is)."""

    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_outputs: int = DEFAULT_MAX_OUTPUTS
    max_input_pixels: int = config.DEFAULT_MAX_IMAGE_PIXELS

    @property
    def ws_binary_bytes(self) -> int:
        return self.max_output_bytes + WS_BINARY_MARGIN


def outputs(limits: config.LimitsConfig) -> Limits:
    """The caps a ComfyUI client applies to one job's outputs, from `[limits]`."""
    return Limits(limits.max_output_bytes, limits.max_outputs, limits.max_image_pixels)


def size_text(size: int) -> str:
    """A byte count for a sentence: 512 MiB, 1.5 GiB, 300 KiB, 12 bytes."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"
