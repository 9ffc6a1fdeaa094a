"""Keeping the Telegram sink away from jobs queued on the web.

The worker hands every finished job to every sink. A web job's result stays in the
database for its page; the Telegram sink must not try to send it to a chat that does not
exist. The wrapper records the delivery as done without sending, so no worker keeps
retrying it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from comfyveil import sinks
from comfyveil.store import jobs
from comfyveil.web import identity


class SkipWebJobs:
    """A sink that passes every job but the web's to `inner`."""

    def __init__(self, inner: sinks.DeliverySink) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    async def deliver(self, job: jobs.Job, outputs: Sequence[jobs.Output]) -> None:
        if identity.is_web_chat(job.chat_id):
            return
        await self.inner.deliver(job, outputs)

    def delivery_detail(self, job_id: uuid.UUID) -> dict[str, Any] | None:
        detail_of = getattr(self.inner, "delivery_detail", None)
        return detail_of(job_id) if detail_of is not None else None
