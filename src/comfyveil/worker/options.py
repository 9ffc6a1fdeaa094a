"""How a worker behaves: its options and the timings they default to."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

POLL_INTERVAL = 5.0  # seconds between two looks at the queue when no NOTIFY arrives
LEASE_SECONDS = 30.0  # a job's lease; renewed every third of it
FINAL_EVENTS = frozenset({"succeeded", "failed", "cancelled"})  # job_events kinds that end a job
DELIVERY_CLAIM_SECONDS = 120.0  # a catch-up delivery's claim; another worker may retry after
SHUTDOWN_GRACE = 8.0  # seconds from the stop signal to a stopped worker (jobs handed back)
# The share of the grace kept for handing unfinished jobs back (a write each), at most
# HANDBACK_RESERVE seconds: running jobs get the rest of it to finish.
HANDBACK_SHARE = 0.25
HANDBACK_RESERVE = 1.0  # seconds
# The share of the grace a process keeps for closing (bot, web, pool, anon, database) once
# its worker has stopped, at most CLOSE_RESERVE seconds.
CLOSE_SHARE = 0.2
CLOSE_RESERVE = 1.5  # seconds
MAX_WAIT_OFFLINE = 1800.0  # seconds a job waits while every GPU is offline, then fails
OFFLINE_CHECK = 1.0  # seconds between two looks at whether any GPU is online
RETRY_BACKOFF = 2.0  # seconds before the first retry of a transient failure, then doubled
RETRY_BACKOFF_MAX = 120.0  # seconds
DELIVERY_GRACE = 30.0  # seconds after a job ended before another worker re-delivers it
DB_RETRY_DELAY = 0.5  # seconds between tries of a write while the database is unreachable
CANCELLED_HERE_KEPT = 1000  # ids of jobs a worker cancelled itself, remembered for late news
PROGRESS_INTERVAL = 0.5  # seconds between two progress writes of one job
PROGRESS_SETTLE = 0.2  # seconds a change of state (waiting, queued, running) waits to be written
WITHDRAW_TIMEOUT = 10.0  # seconds to take an earlier attempt's prompt back from a backend
# Seconds a retry waits for a backend that cannot be reached but may still run the job's
# prompt (a partition, anon starting again on the bot's host), probing it every
# UNREACHABLE_PROBE seconds, before it runs the prompt elsewhere.
UNREACHABLE_WAIT = 60.0
UNREACHABLE_PROBE = 2.0
MAX_ORPHANS = 1000  # prompts remembered per backend, to take back once it answers again
DELIVERY_BACKOFF = 30.0  # seconds before a failed delivery is tried again, then doubled
DELIVERY_BACKOFF_MAX = 1800.0  # seconds, the longest wait between two tries of a delivery
# Tries of a delivery the destination refused (chat gone, bot blocked or removed): a few, in
# case the user unblocks the bot soon; about 7.5 minutes with the default backoff.
DELIVERY_REFUSED_TRIES = 5
# Tries of a delivery that failed otherwise (Telegram unreachable, an internal error): enough
# to ride out an outage of about a day with the default backoff.
DELIVERY_TRIES = 55
CATCH_UP_PAGE = 100  # undelivered jobs read at a time by the catch-up
WAITING_BACK_KEPT = 10_000  # deliveries per sink remembered to try once it is back


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker behaves; the defaults suit production, tests shorten the times."""

    worker_id: str = ""  # default: host-pid-random
    lease_seconds: float = LEASE_SECONDS
    poll_interval: float = POLL_INTERVAL
    job_timeout: float = 1800.0
    shutdown_grace: float = SHUTDOWN_GRACE
    retry_backoff: float = RETRY_BACKOFF
    recover_interval: float | None = None  # default: a sixth of the lease
    delivery_grace: float = DELIVERY_GRACE
    listen: bool = True  # LISTEN for NOTIFY; False: polling only
    delivery_backoff: float = DELIVERY_BACKOFF
    delivery_refused_tries: int = DELIVERY_REFUSED_TRIES
    delivery_tries: int = DELIVERY_TRIES
    max_wait_offline: float = MAX_WAIT_OFFLINE  # seconds a job waits with every GPU offline
    unreachable_wait: float = UNREACHABLE_WAIT  # for the backend that may run its prompt


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def stop_deadline(grace: float, since: float) -> float:
    """When a worker of a process stopped at `since` (time.monotonic()) must be stopped,
    for the whole process to end within `grace` seconds of its signal."""
    return since + grace - min(CLOSE_RESERVE, grace * CLOSE_SHARE)
