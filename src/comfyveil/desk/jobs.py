"""A user's jobs after they are queued, for every front end: a result only its owner may
read, and forgetting a user (the store's rows and what the GPU hosts still hold)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from comfyveil import retention
from comfyveil.store import accounts, database, jobs

if TYPE_CHECKING:
    from comfyveil.comfy import pool as pool_mod
    from comfyveil.desk.services import AccountDesk


async def owned_output(
    svc: AccountDesk, account: accounts.Account, job_id: uuid.UUID, index: int
) -> jobs.Output | None:
    """Output `index` of job `job_id` if the job is this account's; else None."""
    if await svc.web.output_owner(job_id) != account.user_id:
        return None
    return next((o for o in await svc.db.jobs.outputs(job_id) if o.index == index), None)


def parse_ref(ref: str) -> tuple[uuid.UUID, int] | None:
    """A "JOBID:INDEX" reference to a result, or None when malformed."""
    job, _, index = ref.partition(":")
    try:
        return uuid.UUID(job), int(index)
    except ValueError:
        return None


async def forget(
    db: database.Database,
    pool: pool_mod.Pool | None,
    user_id: int,
    spawn: Callable[..., Any],
) -> int:
    """Delete what is stored about `user_id` and what the GPU hosts hold of their jobs
    (cleaned in the background by `spawn`); how many jobs were deleted."""
    left = await retention.forget_on_backends(db, pool, user_id)
    # an admin's grant, ban or quota is not the user's data: the store keeps those
    deleted = await db.users.forget(user_id)
    if left and pool is not None:
        spawn(
            retention.sweep(db, pool, left, stop_running=True),
            name="forget-on-backends",
        )
    return deleted
