"""comfyveil: a private, self-hosted Telegram front end for ComfyUI."""

from __future__ import annotations

__version__ = "0.1.0"
