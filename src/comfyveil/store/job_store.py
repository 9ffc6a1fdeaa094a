"""`JobStore`, every database operation on jobs in one object (`Database.jobs`): the
parts, one module each, share the reads of `job_reads`."""

from __future__ import annotations

from comfyveil.store.job_deliveries import JobDeliveries
from comfyveil.store.job_eta import JobEta
from comfyveil.store.job_leases import JobLeases
from comfyveil.store.job_queue import JobQueue


class JobStore(JobQueue, JobLeases, JobEta, JobDeliveries):
    """Every database operation on jobs."""
