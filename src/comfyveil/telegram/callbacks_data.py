"""The ``callback_data`` of inline buttons: short strings (Telegram allows 64 bytes).

    again:JOB            re-roll a result with a new seed
    cancel:JOB           cancel a job from its status message
    edit:JOB:INDEX       explain editing; make this result the chat's image to edit
    file:JOB:INDEX       send this output again as an uncompressed file
    set:KEY:VALUE        change one of the user's /settings
    forget:yes|no        confirm or abandon /forget

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


def setting(key: str, value: str) -> str:
    return f"set:{key}:{value}"


def forget(confirm: bool) -> str:
    return f"forget:{'yes' if confirm else 'no'}"


def parse(data: str | None) -> Press | None:
    """The press a button's data stands for, or None for data we never sent."""
    if not data:
        return None
    action, _, rest = data.partition(":")
    try:
        if action in ("again", "cancel"):
            return Press(action, uuid.UUID(hex=rest))
        if action in ("edit", "file"):
            job, _, index = rest.partition(":")
            return Press(action, uuid.UUID(hex=job), int(index or 0))
        if action == "set":
            key, _, value = rest.partition(":")
            return Press(action, key=key, value=value)
        if action == "forget" and rest in ("yes", "no"):
            return Press(action, value=rest)
    except ValueError:
        return None
    return None
