"""Small helpers every handler uses to answer: plain sentences, HTML, refusals."""

from __future__ import annotations

import asyncio
import functools
import html
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from telegram import Message, ReplyParameters, Update
from telegram.constants import ParseMode
from telegram.error import BadRequest, NetworkError, RetryAfter, TelegramError

from comfyveil import errors
from comfyveil.desk.failures import DATABASE_DOWN as DATABASE_DOWN
from comfyveil.desk.failures import INTERNAL as INTERNAL
from comfyveil.desk.failures import plain_sentence as sentence
from comfyveil.i18n import _
from comfyveil.store import errors as store_errors
from comfyveil.telegram.limits import retry_after_seconds

logger = logging.getLogger(__name__)

# Seconds between the tries of an error reply the Bot API failed (about a minute in all).
ERROR_REPLY_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def esc(text: str) -> str:
    return html.escape(text, quote=False)


def user_message(exc: errors.ComfyveilError) -> str:
    """What to tell a chat user about an error of ours."""
    if isinstance(exc, store_errors.DatabaseUnreachable):
        return _(DATABASE_DOWN)
    # A message raised in English (a class's docstring) is translated here when the
    # catalog has it; one raised already translated is not in the catalog and stays.
    return sentence(_(str(exc)))


async def reply(update: Update, text: str, **kwargs: Any) -> Message | None:
    """Answer the update's message in its chat (HTML), as a reply in groups."""
    message = update.effective_message
    chat = update.effective_chat
    if chat is None:
        return None
    if message is not None and chat.type != "private":
        kwargs.setdefault(
            "reply_parameters",
            ReplyParameters(message.message_id, allow_sending_without_reply=True),
        )
    return await update.get_bot().send_message(
        chat.id, text, parse_mode=ParseMode.HTML, **kwargs
    )


async def _reply_surely(update: Update, text: str) -> None:
    """`reply`, sent again while the Bot API fails, times out or asks to wait longer
    than the rate limiter waits itself (a 5xx, a lost connection, a 429 that outlasted
    its retries): the sentence is the user's only answer; nothing else would send it."""
    for delay in (*ERROR_REPLY_RETRY_DELAYS, None):
        try:
            await reply(update, text)
            return
        except BadRequest as send_error:  # refused (a NetworkError in PTB): not again
            logger.info("could not send the error reply: %s", type(send_error).__name__)
            return
        except (NetworkError, RetryAfter) as send_error:  # 5xx, TimedOut, lost, 429
            if delay is None:
                logger.info("could not send the error reply: %s", type(send_error).__name__)
                return
            if isinstance(send_error, RetryAfter):
                delay = max(delay, retry_after_seconds(send_error))
            await asyncio.sleep(delay)
        except TelegramError as send_error:
            logger.info("could not send the error reply: %s", type(send_error).__name__)
            return


def plain_errors(handler: F) -> F:
    """Answer comfyveil's own errors with their one sentence; let the rest reach the
    application's error handler (which logs them and apologises)."""

    @functools.wraps(handler)
    async def wrapper(update: Update, context: Any) -> Any:
        try:
            return await handler(update, context)
        except errors.ComfyveilError as exc:
            if not isinstance(exc, errors.UsageError):
                logger.warning("request failed: %s", type(exc).__name__,
                               extra={"action": "request_failed"})
            await _reply_surely(update, esc(user_message(exc)))
            return None

    return wrapper  # type: ignore[return-value]
