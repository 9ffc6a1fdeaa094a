"""The ``callback_data`` of inline buttons: short strings (Telegram allows 64 bytes).

    again:JOB            re-roll a result with a new seed
    cancel:JOB           cancel a job from its status message
    edit:JOB:INDEX       explain editing; make this result the chat's image to edit
    file:JOB:INDEX       send this output again as an uncompressed file
    set:KEY:VALUE        change one of the user's /settings
    forget:yes|no        confirm or abandon /forget

`set` and `forget` carry the id of the user the message is for (``set@USER:KEY:VALUE``):
in a group anyone sees the buttons, and only that user's press counts.

JOB is the job's UUID as 32 hex digits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Press:
    action: str
    job_id: uuid.UUID | None = None
    index: int = 0
    key: str = ""
    value: str = ""
    owner: int | None = None  # the only user whose press counts (None: older buttons)


def _hex(job_id: str | uuid.UUID) -> str:
    return uuid.UUID(str(job_id)).hex


def again(job_id: str | uuid.UUID) -> str:
    return f"again:{_hex(job_id)}"


def cancel(job_id: str | uuid.UUID) -> str:
    return f"cancel:{_hex(job_id)}"


def edit(job_id: str | uuid.UUID, index: int) -> str:
    return f"edit:{_hex(job_id)}:{index}"


def as_file(job_id: str | uuid.UUID, index: int) -> str:
    return f"file:{_hex(job_id)}:{index}"


def _owned(action: str, owner: int | None) -> str:
    return action if owner is None else f"{action}@{owner}"


def setting(key: str, value: str, owner: int | None = None) -> str:
    return f"{_owned('set', owner)}:{key}:{value}"


def forget(confirm: bool, owner: int | None = None) -> str:
    return f"{_owned('forget', owner)}:{'yes' if confirm else 'no'}"


def parse(data: str | None) -> Press | None:
    """The press a button's data stands for, or None for data we never sent."""
    if not data:
        return None
    action, _, rest = data.partition(":")
    action, _, owner_text = action.partition("@")
    try:
        owner = int(owner_text) if owner_text else None
        if action in ("again", "cancel"):
            return Press(action, uuid.UUID(hex=rest))
        if action in ("edit", "file"):
            job, _, index = rest.partition(":")
            return Press(action, uuid.UUID(hex=job), int(index or 0))
        if action == "set":
            key, _, value = rest.partition(":")
            return Press(action, key=key, value=value, owner=owner)
        if action == "forget" and rest in ("yes", "no"):
            return Press(action, value=rest, owner=owner)
    except ValueError:
        return None
    return None
