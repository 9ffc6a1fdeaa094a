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
