"""Counts of prompts the content policy refused, per UTC day and command; nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from comfyveil import metrics
from comfyveil.store.connector import Connector


@dataclass(frozen=True)
class RefusalCount:
    command: str
    today: int
    week: int  # the last 7 UTC days, today included
    total: int


class RefusalStore:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.db = Connector(pool)

    async def count(self, command: str) -> None:
        """One more refusal for `command` today."""
        metrics.refused(command, by_policy=True)
        await self.db.run("count_refusal", command=command)

    async def counts(self) -> list[RefusalCount]:
        """Every command's refusals, most refused first."""
        return [
            RefusalCount(
                command=r["command"],
                today=int(r["today"] or 0),
                week=int(r["week"] or 0),
                total=int(r["total"] or 0),
            )
            for r in await self.db.all("refusal_counts")
        ]
