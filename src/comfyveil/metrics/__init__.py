"""Prometheus metrics: what every process counts, served by `metrics.server` when
``[metrics] enabled`` (off by default).

The counters are plain in-memory objects whatever the setting, so the code that counts
(the worker settling a job, the Bot API client, the web login) never asks whether
metrics are on. Names follow Prometheus' conventions: one prefix, base units
(`_seconds`), `_total` on counters. Labels hold only names the operator chose (commands,
backends) or our own words (outcomes, Bot API methods): never a user or chat id, a prompt
or a file name; `label` also caps their length, so no label can grow without bound.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from comfyveil import __version__

PREFIX = "comfyveil"
MAX_LABEL = 64  # characters; a command or backend name is far shorter
OUTCOMES = ("succeeded", "failed", "cancelled", "refused")

# Our own registry, not the library's global one: a scrape shows comfyveil's metrics and
# the process' CPU and memory, and tests can read it without other libraries' metrics.
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

JOBS = Counter(
    f"{PREFIX}_jobs",
    "Jobs that ended, by command and outcome (refused: never queued).",
    ["command", "outcome"],
    registry=REGISTRY,
)
# From a few seconds (a warm Flux Schnell) to an hour (a long Wan clip).
RUN_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
WAIT_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
JOB_WAIT = Histogram(
    f"{PREFIX}_job_wait_seconds",
    "Seconds a job waited in the queue before a worker first claimed it.",
    ["command"],
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
JOB_RUN = Histogram(
    f"{PREFIX}_job_run_seconds",
    "Seconds from ComfyUI's start of a job's prompt to the job's end (the running time "
    "every front end shows), for jobs that succeeded or failed on a backend.",
    ["backend", "command"],
    buckets=RUN_BUCKETS,
    registry=REGISTRY,
)
JOB_GPU_WAIT = Histogram(
    f"{PREFIX}_job_gpu_wait_seconds",
    "Seconds from a worker's claim of a job to ComfyUI's start of its prompt (waiting for "
    "a GPU, then in that GPU's own queue), for jobs that succeeded or failed on a backend.",
    ["backend", "command"],
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
QUEUE = Gauge(
    f"{PREFIX}_queue_jobs",
    "Jobs in the database by state (read at scrape time; all "
    "workers together, so take max() across instances).",
    ["state"],
    registry=REGISTRY,
)
BACKEND_UP = Gauge(
    f"{PREFIX}_backend_up",
    "1 when this process' last probe of the backend succeeded.",
    ["backend"],
    registry=REGISTRY,
)
BACKEND_BUSY = Gauge(
    f"{PREFIX}_backend_busy",
    "Jobs on the backend (ours and others') as this process sees it.",
    ["backend"],
    registry=REGISTRY,
)
WORKERS = Gauge(
    f"{PREFIX}_workers",
    "Workers whose heartbeat is younger than the lease (read at scrape time from the database).",
    registry=REGISTRY,
)
TELEGRAM_REQUESTS = Counter(
    f"{PREFIX}_telegram_requests",
    "Bot API requests, by method and outcome (ok, error, retry_after, network).",
    ["method", "outcome"],
    registry=REGISTRY,
)
TELEGRAM_RETRY_AFTER = Counter(
    f"{PREFIX}_telegram_retry_after",
    "Bot API answers 429 (flood control: retry after).",
    registry=REGISTRY,
)
WEB_LOGINS = Counter(
    f"{PREFIX}_web_logins",
    "Web sign-ins, by outcome (succeeded, failed, refused).",
    ["outcome"],
    registry=REGISTRY,
)
POLICY_REFUSALS = Counter(
    f"{PREFIX}_policy_refusals",
    "Prompts the content policy refused, by command.",
    ["command"],
    registry=REGISTRY,
)
BUILD_INFO = Gauge(
    f"{PREFIX}_build_info",
    "Always 1; the version of comfyveil in its label.",
    ["version"],
    registry=REGISTRY,
)
BUILD_INFO.labels(version=__version__).set(1)

# Every metric family this module defines (alerts and the docs may name only these).
NAMES = frozenset(
    m._name
    for m in (
        JOBS,
        JOB_WAIT,
        JOB_RUN,
        JOB_GPU_WAIT,
        QUEUE,
        BACKEND_UP,
        BACKEND_BUSY,
        WORKERS,
        TELEGRAM_REQUESTS,
        TELEGRAM_RETRY_AFTER,
        WEB_LOGINS,
        POLICY_REFUSALS,
        BUILD_INFO,
    )
)


def label(value: object) -> str:
    return str(value)[:MAX_LABEL]


def _seconds(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def job_claimed(job: Any) -> None:
    """A worker claimed `job` (a store Job): its wait, on its first attempt only (a retry
    waited for its backoff, not for a GPU)."""
    if getattr(job, "attempts", 1) <= 1:
        waited = _seconds(job.created_at, job.started_at)
        if waited is not None:
            JOB_WAIT.labels(command=label(job.command)).observe(waited)


def job_ended(job: Any) -> None:
    """`job` (a store Job) reached a final state here: count it once, and when ComfyUI
    ran it, its time waiting on the GPU side and its run time, in the job states every
    front end shows (running counts from ComfyUI's start, not from the claim)."""
    outcome = str(getattr(job.status, "value", job.status))
    if outcome not in OUTCOMES:
        return  # queued again (a retry, a hand-back): not an end
    command = label(job.command)
    JOBS.labels(command=command, outcome=outcome).inc()
    executing_at = getattr(job, "executing_at", None)
    ran = _seconds(executing_at, job.finished_at)
    if outcome in ("succeeded", "failed") and job.backend and ran is not None:
        backend = label(job.backend)
        JOB_RUN.labels(backend=backend, command=command).observe(ran)
        gpu_wait = _seconds(job.started_at, executing_at)
        if gpu_wait is not None:
            JOB_GPU_WAIT.labels(backend=backend, command=command).observe(gpu_wait)


def refused(command: str, *, by_policy: bool) -> None:
    """A job was refused before it was queued (the content policy, or a user's limits)."""
    JOBS.labels(command=label(command), outcome="refused").inc()
    if by_policy:
        POLICY_REFUSALS.labels(command=label(command)).inc()


def telegram_request(method: str, outcome: str) -> None:
    TELEGRAM_REQUESTS.labels(method=label(method), outcome=outcome).inc()
    if outcome == "retry_after":
        TELEGRAM_RETRY_AFTER.inc()


def web_login(outcome: str) -> None:
    """succeeded; failed (a wrong name or passphrase); refused (throttled, locked, banned)."""
    WEB_LOGINS.labels(outcome=outcome).inc()
