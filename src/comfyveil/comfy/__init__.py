"""Talking to ComfyUI: the client, its events and errors, workflows and the pool.

Import the modules, not names: `from comfyveil.comfy import client, errors, events`.
"""

from __future__ import annotations
