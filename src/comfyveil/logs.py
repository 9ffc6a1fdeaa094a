"""Log output: plain lines for a terminal, or one JSON object a line for journald and
Loki (`--log-format json` or ``[log] format = "json"``).

The JSON lines carry the fields the code's `extra=` already gives (action, job_id,
worker, ...) beside time, level, logger and message. Redaction (`redaction.py`) cleans
every record when it is made, whichever format prints it; the JSON formatter redacts its
whole line once more, so a secret in an `extra=` value or a traceback never gets out
either.
"""

from __future__ import annotations

import logging
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from comfyveil import redaction

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")
_chosen_on_command_line = False


class RedactingJsonFormatter(JsonFormatter):
    """python-json-logger's formatter, with the line redacted as a whole."""

    def __init__(self) -> None:
        super().__init__(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            datefmt="%Y-%m-%dT%H:%M:%S%z",
        )

    def formatException(self, ei: Any) -> str:
        # as the text lines do: database errors by type and SQLSTATE, never their text, which
        # may quote a prompt
        return redaction.redact(redaction.format_exception(ei))

    def format(self, record: logging.LogRecord) -> str:
        return redaction.redact(super().format(record))


def formatter(name: str) -> logging.Formatter:
    return RedactingJsonFormatter() if name == "json" else logging.Formatter(TEXT_FORMAT)


# Libraries whose debug lines carry message bodies: python-telegram-bot logs every update
# and request (prompts, /web links), websockets every frame, aiohttp's server requests.
# They stay at INFO whatever the verbosity: -vv must not put prompts in the logs.
QUIET_LIBRARIES = ("telegram", "websockets", "aiohttp", "httpx", "httpcore", "hpack")
# python-telegram-bot logs an answer it cannot parse (the HTML page a proxy in front of the
# Bot API sends in an outage) at ERROR with a traceback, for every call, then raises the
# NetworkError our own lines report (a failed poll, a delivery tried again): left out.
UNPARSABLE_ANSWER = ("telegram.request.BaseRequest", "Can not load invalid JSON data")
# huggingface_hub's client logs each request's URL at INFO (a hub's signed CDN address is
# a working download link) and each response's headers at DEBUG: WARNING and above only.
SILENT_LIBRARIES = ("httpx2", "httpcore2")


def configure(level: int, fmt: str | None) -> None:
    """Set up the root logger; `fmt` from the command line (None: text, until the
    settings say otherwise, see `apply_settings`)."""
    global _chosen_on_command_line
    _chosen_on_command_line = fmt is not None
    logging.basicConfig(level=level, format=TEXT_FORMAT)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(level, logging.INFO))
    for name in SILENT_LIBRARIES:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    logging.getLogger(UNPARSABLE_ANSWER[0]).addFilter(_not_an_unparsable_answer)
    use(fmt or "text")
    redaction.install()  # secrets registered later (the bot token) never reach a line


def _not_an_unparsable_answer(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(UNPARSABLE_ANSWER[1])


def use(fmt: str) -> None:
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter(fmt))


def apply_settings(settings: Any) -> None:
    """``[log] format`` from the settings file, unless --log-format chose already."""
    if not _chosen_on_command_line and settings.log.format != "text":
        use(settings.log.format)
