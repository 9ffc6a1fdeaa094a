"""Updates from the Bot API that python-telegram-bot cannot read, made harmless.

PTB turns getUpdates' answer into `Update` objects inside its polling loop, and that loop
catches only `TelegramError`: one update it cannot read (a field of the wrong type, a
missing one; Telegram misbehaving, or whatever answers in its place) raised a TypeError
there, ended polling, and the bot heard nothing more until restarted. Each such update is
replaced here by a bare ``{"update_id": N}``, which PTB reads and our handlers ignore:
polling goes on, and the offset moves past it instead of fetching it again forever.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from telegram import Update
from telegram.error import NetworkError

logger = logging.getLogger(__name__)


class NoUpdateId(NetworkError):
    """An update without its id: the offset cannot move past it. Raised as the network
    error it is like, so PTB's polling loop waits and asks again instead of ending."""


def readable(body: bytes) -> bytes:
    """getUpdates' answer with every update PTB cannot read replaced by a bare one; any
    other answer as it came (PTB's own checks refuse what is not a Bot API answer).

    Raises:
        NoUpdateId: an update has no integer id.
    """
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(answer, dict) or not isinstance(answer.get("result"), list):
        return body
    updates: list[Any] = answer["result"]
    changed = False
    for index, update in enumerate(updates):
        if _reads(update):
            continue
        update_id = update.get("update_id") if isinstance(update, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            raise NoUpdateId("the Bot API sent an update without its id")
        updates[index] = {"update_id": update_id}
        changed = True
        # Its kind and id only: the update's text is a user's message.
        logger.warning("an update the Bot API sent could not be read; skipped",
                       extra={"action": "update_unreadable", "update_id": update_id})
    return json.dumps(answer).encode() if changed else body


def _reads(update: object) -> bool:
    if not isinstance(update, dict):
        return False
    try:
        Update.de_json(update, None)
    except Exception:  # PTB raises whatever its constructors raise on a wrong field
        return False
    return True


# An update handled for longer than this no longer holds back the confirmation of the
# ones after it (its handler is stuck; a restart would not handle it sooner).
HELD_AT_MOST_S = 300.0
# Seconds to wait when a poll brought back only updates still being handled: Telegram
# answers at once while any update is unconfirmed, so without a pause this polls hot.
STALE_PAUSE_S = 0.25


class Handling:
    """Updates fetched but not handled yet, so that none is lost to a crash.

    getUpdates confirms every update before the offset it is asked with, and PTB asks with
    the next id as soon as it has fetched a batch, while the batch is still being handled:
    a bot killed then (SIGKILL, power lost) lost those messages for good, unanswered. The
    bot's getUpdates request asks instead from the oldest update still being handled
    (`floor`), so Telegram keeps it until its handler ended and a restarted bot fetches
    it again; handling it twice is harmless (a job is queued once per update id). What
    comes back that PTB already has is dropped before PTB sees it (`fetched`).
    """

    def __init__(self) -> None:
        self._since: dict[int, float] = {}

    def floor(self, offset: int) -> int:
        """The offset to ask with instead of `offset` (PTB's: the next id it wants)."""
        if offset <= 0 or not self._since:
            return offset
        stuck = time.monotonic() - HELD_AT_MOST_S
        for update_id in [u for u, at in self._since.items() if at < stuck]:
            del self._since[update_id]
        return min(offset, *self._since) if self._since else offset

    def fetched(self, body: bytes, offset: int) -> tuple[bytes, bool]:
        """getUpdates' answer without the updates before `offset` (PTB has them; they are
        still being handled), each new one counted as being handled; and whether the
        answer held only such updates (the caller pauses before the next poll)."""
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            return body, False
        if not isinstance(answer, dict) or not isinstance(answer.get("result"), list):
            return body, False
        result: list[Any] = answer["result"]
        fresh = [u for u in result if not (offset > 0 and _id(u) is not None and _id(u) < offset)]
        now = time.monotonic()
        for update in fresh:
            update_id = _id(update)
            if update_id is not None:
                self._since[update_id] = now
        if len(fresh) == len(result):
            return body, False
        answer["result"] = fresh
        return json.dumps(answer).encode(), not fresh

    def done(self, update_id: int) -> None:
        """The update's handler ended (answered, refused, or failed): it may be confirmed."""
        self._since.pop(update_id, None)

    def __len__(self) -> int:
        return len(self._since)


def _id(update: object) -> int | None:
    value = update.get("update_id") if isinstance(update, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
