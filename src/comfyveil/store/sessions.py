"""Per-chat state: the last result, so the next command can edit it (chaining)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from comfyveil.store.connector import Connector, Row


@dataclass(frozen=True)
class OutputRef:
    """Points at one stored output of a job (`JobStore.outputs(job_id)[index]`)."""

    index: int
    filename: str
    kind: str
    mime: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "filename": self.filename, "kind": self.kind,
                "mime": self.mime}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OutputRef:
        return cls(index=int(data["index"]), filename=str(data["filename"]),
                   kind=str(data["kind"]), mime=str(data["mime"]))


@dataclass(frozen=True)
class ChatSession:
    chat_id: int
    user_id: int  # whose job produced the last result
    job_id: uuid.UUID
    outputs: tuple[OutputRef, ...]
    updated_at: dt.datetime

    @classmethod
    def from_row(cls, row: Row) -> ChatSession:
        return cls(
            chat_id=row["chat_id"], user_id=row["user_id"], job_id=row["job_id"],
            outputs=tuple(OutputRef.from_json(o) for o in row["outputs"]),
            updated_at=row["updated_at"],
        )


class SessionStore:
    """`JobStore.complete` already records each chat's last result; this reads and edits it."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.db = Connector(pool)

    async def last_outputs(self, chat_id: int) -> ChatSession | None:
        """The last result in the chat, or None (none yet, or purged with its job)."""
        row = await self.db.one("get_chat_session", chat_id=chat_id)
        return ChatSession.from_row(row) if row else None

    async def set_last_outputs(
        self, chat_id: int, user_id: int, job_id: uuid.UUID, outputs: Sequence[OutputRef]
    ) -> ChatSession:
        row = await self.db.one(
            "set_chat_outputs", chat_id=chat_id, user_id=user_id, job_id=job_id,
            outputs=Jsonb([o.to_json() for o in outputs]),
        )
        assert row is not None
        return ChatSession.from_row(row)

    async def clear(self, chat_id: int) -> bool:
        return await self.db.one("clear_chat_session", chat_id=chat_id) is not None
