"""The Telegram front end: parsing commands, checking images, rendering job state.

``parse`` (commands and options), ``images`` (uploaded image checks) and ``render``
(status, captions, help, history in Telegram HTML) are pure and import nothing from the
store or the worker; the bot wiring builds on them.
"""

from __future__ import annotations
