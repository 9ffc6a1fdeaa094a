"""How web accounts map onto the store's user and chat ids.

Telegram ids (users and chats alike) lie within +-2^53. A web account's own id is
placed below -2^62, so it never collides with one; its jobs carry it as `chat_id` for
their whole life, which tells every Telegram part that the job is not theirs to deliver.
"""

from __future__ import annotations

WEB_ID_BASE = -(1 << 62)


def web_user_id(account_id: int) -> int:
    """The user id (and chat id) a new web account gets."""
    return WEB_ID_BASE - account_id


def is_web_chat(chat_id: int) -> bool:
    """True for the chat id of a job queued from the web front end."""
    return chat_id <= WEB_ID_BASE
