"""Secrets never reach a log line: the last line of defence behind careful messages.

    redaction.register(token)   # once it is read
    redaction.install()         # every log record of this process is then redacted

The code that handles a secret keeps it out of messages, exception chains and reprs
itself (see telegram/request.py); this catches what slips past, above all third-party
messages: python-telegram-bot logs ``Set Bot API URL: .../bot<TOKEN>`` at debug level,
and aiohttp's errors quote the request URL, which holds the token. It works at record
creation (a log record factory), so every handler sees the redacted record: the CLI's,
pytest's, any an operator adds. Tracebacks are formatted and redacted there too. A URL's
query string is masked whatever it holds (signed download links are one).
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from typing import Any

MASK = "[redacted]"
MIN_LENGTH = 6  # shorter "secrets" would mask ordinary words
# Bot API tokens have this shape; masked even when not registered (a second bot, a test).
_TOKEN_SHAPE = re.compile(r"\b\d{6,}:[A-Za-z0-9_-]{30,}\b")

# A URL's query string: a signed download address (a hub's CDN redirect) is a working
# link by its query alone, and huggingface_hub's retry warning quotes it.
_QUERY = re.compile(r"\b([a-z][a-z0-9+.-]*://[^\s?#\"'<>]+)\?[^\s\"'<>)]*", re.IGNORECASE)

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()
_installed = False


def register(secret: str | None) -> None:
    """Mask `secret` in every log record from now on."""
    global _secrets
    if not secret or len(secret) < MIN_LENGTH:
        return
    with _lock:
        if secret not in _secrets:
            # Longest first: a secret that contains another is masked whole.
            _secrets = tuple(sorted((*_secrets, secret), key=len, reverse=True))


def redact(text: str) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    text = _QUERY.sub(lambda m: f"{m.group(1)}?{MASK}", text)
    return _TOKEN_SHAPE.sub(MASK, text)


def _redact_record(record: logging.LogRecord) -> None:
    message = record.getMessage()
    clean = redact(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and not record.exc_text:
        # The formatter would format the traceback later, unredacted: do it now.
        record.exc_text = format_exception(record.exc_info)
    if record.exc_text:
        record.exc_text = redact(record.exc_text)  # formatters print it as it is
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


def format_exception(exc_info: Any) -> str:
    """A traceback in which database errors show their type and SQLSTATE only: their text
    quotes the values the database refused (PostgreSQL's DETAIL and CONTEXT lines hold a
    prompt's JSON)."""
    _, value, _ = exc_info
    if value is None:
        return logging.Formatter().formatException(exc_info)
    return "".join(_formatted(value)).rstrip("\n")


def _formatted(value: BaseException) -> list[str]:
    """`traceback.format_exception`, with each database error's text replaced."""
    top = traceback.TracebackException.from_exception(value)
    stack: list[tuple[traceback.TracebackException, BaseException | None]] = [(top, value)]
    seen: set[int] = set()
    while stack:
        te, exc = stack.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        if exc is not None and type(exc).__module__.split(".")[0] == "psycopg":
            state = getattr(exc, "sqlstate", None)
            te._str = f"(SQLSTATE {state})" if state else "(text withheld)"  # type: ignore[attr-defined]
            te.__notes__ = None
        if te.__cause__ is not None:
            stack.append((te.__cause__, exc.__cause__ if exc is not None else None))
        if te.__context__ is not None:
            stack.append((te.__context__, exc.__context__ if exc is not None else None))
    return list(top.format())


def install() -> None:
    """Redact every log record this process makes from now on (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True
