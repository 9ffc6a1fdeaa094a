"""PostgreSQL store: jobs queue, users, chat sessions, commands.

Modules: `database` (open, migrate, LISTEN), `embedded` (pgserver), `jobs` (what a job
is) and `job_store` (`JobStore`: `job_reads`, `job_queue`, `job_leases`, `job_eta`,
`job_deliveries`), `users`, `sessions`, `commands`, `errors`, `sql` (the named queries of
`queries.sql`).
"""

from __future__ import annotations
