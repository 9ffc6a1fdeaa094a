"""The worker: claims jobs from PostgreSQL, runs them on the backend pool, reports back.

The loop, in the manner of procrastinate's worker:

- side tasks: lease renewal (which also notices cancel requests), LISTEN for new jobs and
  job updates (with polling as the fallback), expired-lease recovery, re-delivery of
  finished jobs whose delivery was never recorded; the pool runs its own health probes.
- the main loop claims jobs only while a backend has a free slot (so the database, not
  this process, holds the waiting work), each job runs as a named task, then it waits for
  the first of: a NOTIFY, a freed slot, the poll interval, a stop request.
- the job id is ComfyUI's prompt_id. A job whose prompt a backend already accepted (a
  worker died after submitting it, or an attempt ended in a transient error after it)
  is re-attached with `client.follow` instead of being submitted again, so the GPU work
  is never paid twice; when that backend is down, the prompt is withdrawn there (if it
  answers) before the job runs elsewhere, and a cancelled retry has its prompt stopped.
- transient failures (backend unreachable or restarted) go back to the queue with backoff
  and run on another backend; permanent ones (bad parameters, a missing model, an
  execution error) fail at once with the plain message.
- the final status of a job is written under `asyncio.shield`; a stop asks running jobs to
  finish within a grace period and hands the others back (re-attached by the next worker).
  With no trace, what a job left on its backend (its images in the temp folder, its
  history entry) is removed only after that write: a successor still finds them.
- a database outage costs no live worker its jobs: leases are renewed over a connection of
  the worker's own that reconnects at each try, recovery takes no lease until the server
  has been up for a lease, and a worker restarted under the same id takes its own running
  jobs back as it starts.
"""

from __future__ import annotations

from comfyveil.worker.loop import Worker
from comfyveil.worker.options import (
    DB_RETRY_DELAY,
    DELIVERY_CLAIM_SECONDS,
    DELIVERY_GRACE,
    FINAL_EVENTS,
    LEASE_SECONDS,
    POLL_INTERVAL,
    PROGRESS_INTERVAL,
    PROGRESS_SETTLE,
    RETRY_BACKOFF,
    RETRY_BACKOFF_MAX,
    SHUTDOWN_GRACE,
    WorkerOptions,
    default_worker_id,
)

__all__ = [
    "DB_RETRY_DELAY",
    "DELIVERY_CLAIM_SECONDS",
    "DELIVERY_GRACE",
    "FINAL_EVENTS",
    "LEASE_SECONDS",
    "POLL_INTERVAL",
    "PROGRESS_INTERVAL",
    "PROGRESS_SETTLE",
    "RETRY_BACKOFF",
    "RETRY_BACKOFF_MAX",
    "SHUTDOWN_GRACE",
    "Worker",
    "WorkerOptions",
    "default_worker_id",
]
