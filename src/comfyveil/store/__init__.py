"""PostgreSQL store: jobs queue, users, chat sessions, commands.

Modules: `database` (open, migrate, LISTEN), `embedded` (pgserver), `jobs`, `users`,
`sessions`, `commands`, `errors`, `sql` (the named queries of `queries.sql`).
"""

from __future__ import annotations
