"""What a job is: its states, the rows the queue stores (`Job`, its inputs, outputs and
events) and the request that creates one (`NewJob`).

A job goes `queued -> running -> succeeded | failed | cancelled`. Workers claim with
`FOR UPDATE SKIP LOCKED` and hold a lease they renew; a running job whose lease expires
goes back to the queue with `submitted` and `backend` kept, so the next worker re-attaches
to the prompt already on the GPU instead of paying for it twice. Every state change appends
a `job_events` row, and a trigger on that table sends NOTIFY on `comfyveil_job_updates`
(and on `comfyveil_jobs` when a job becomes claimable), so nobody needs to poll.

The operations on jobs are `job_store.JobStore` (`db.jobs`), put together from one module
per part: `job_reads`, `job_queue`, `job_leases`, `job_eta`, `job_deliveries`.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from comfyveil.store.connector import Row

DEFAULT_MAX_ATTEMPTS = 3
NO_CHAT = 0  # the chat_id of jobs queued without a chat (`comfyveil submit`)
# How a job's delivery to a sink ended (deliveries.outcome).
DELIVERED, FAILED, SKIPPED = "delivered", "failed", "skipped"


class Status(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


@dataclass(frozen=True)
class InputImage:
    """An image a user sent with a command; kept until the job ends."""

    filename: str
    mime: str
    data: bytes = field(repr=False)

    @classmethod
    def from_row(cls, row: Row) -> InputImage:
        return cls(filename=row["filename"], mime=row["mime"], data=bytes(row["data"]))


@dataclass(frozen=True)
class Output:
    """One file a job produced. `index` is its place among the job's outputs."""

    filename: str
    kind: str  # image, video, audio, ...
    mime: str
    data: bytes = field(repr=False)
    index: int = 0

    @property
    def size(self) -> int:
        return len(self.data)

    @classmethod
    def from_row(cls, row: Row) -> Output:
        return cls(
            filename=row["filename"], kind=row["kind"], mime=row["mime"],
            data=bytes(row["data"]), index=row["index"],
        )


@dataclass(frozen=True)
class NewJob:
    """What the front end asks for; `enqueue` turns it into a `Job`."""

    user_id: int
    chat_id: int
    command: str
    workflow_hash: str
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: Sequence[InputImage] = ()
    idempotency_key: str | None = None  # e.g. "tg:<chat>:<message>"; a retry returns the same job
    priority: int = 0  # higher first
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backends: tuple[str, ...] | None = None  # backends able to run it; None: any
    status_message_id: int | None = None
    id: uuid.UUID = field(default_factory=uuid.uuid4)  # also ComfyUI's prompt_id


@dataclass(frozen=True)
class Job:
    id: uuid.UUID
    idempotency_key: str | None
    user_id: int
    chat_id: int
    command: str
    workflow_hash: str
    params: dict[str, Any]
    backends: tuple[str, ...] | None
    status: Status
    submitted: bool
    backend: str | None
    attempts: int
    max_attempts: int
    priority: int
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    not_before: dt.datetime | None
    cancel_requested: bool
    error: str | None
    status_message_id: int | None
    progress: dict[str, Any]
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime
    request_message_id: int | None = None  # the chat message that asked for it
    requested_by: str | None = None  # who asked, in groups (a display name)
    executing_at: dt.datetime | None = None  # when ComfyUI started its prompt
    plan: str | None = None  # the backend its ETA announced (comfy/routing.py, keep_plan)

    @classmethod
    def from_row(cls, row: Row) -> Job:
        backends = row["backends"]
        return cls(
            id=row["id"],
            idempotency_key=row["idempotency_key"],
            user_id=row["user_id"],
            chat_id=row["chat_id"],
            command=row["command"],
            workflow_hash=row["workflow_hash"],
            params=row["params"],
            backends=tuple(backends) if backends is not None else None,
            status=Status(row["status"]),
            submitted=row["submitted"],
            backend=row["backend"],
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            priority=row["priority"],
            lease_owner=row["lease_owner"],
            lease_expires_at=row["lease_expires_at"],
            not_before=row["not_before"],
            cancel_requested=row["cancel_requested"],
            error=row["error"],
            status_message_id=row["status_message_id"],
            progress=row["progress"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            updated_at=row["updated_at"],
            request_message_id=row.get("request_message_id"),
            requested_by=row.get("requested_by"),
            executing_at=row.get("executing_at"),
            plan=row.get("plan"),
        )


@dataclass(frozen=True)
class JobEvent:
    id: int
    job_id: uuid.UUID
    at: dt.datetime
    kind: str  # queued, claimed, submitted, succeeded, retry_scheduled, failed, ...
    status: Status
    data: dict[str, Any]

    @classmethod
    def from_row(cls, row: Row) -> JobEvent:
        return cls(
            id=row["id"], job_id=row["job_id"], at=row["at"], kind=row["kind"],
            status=Status(row["status"]), data=row["data"],
        )


def seconds(value: dt.timedelta | float) -> float:
    """A duration given as seconds or a timedelta, in seconds."""
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
