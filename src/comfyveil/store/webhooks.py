"""Webhook endpoints of web accounts and their outbox (migration 0026).

A job of the jobs API that ends writes one delivery per endpoint of its account in the
transaction that ended it (a trigger); `watch` makes any other job do the same (an
images request whose client went away). A sender takes an endpoint with `claim` (one
delivery in flight per endpoint, across processes), sends its oldest due delivery and
records the answer; failures wait longer each time and are given up after a day."""

from __future__ import annotations

import base64
import datetime as dt
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from comfyveil.store.pooled import PoolStore

SECRET_PREFIX = "whsec_"  # the Standard Webhooks form OpenAI's SDK and its verifier take
CHANNEL = "comfyveil_webhooks"  # NOTIFY when deliveries are queued
GIVE_UP_AFTER = dt.timedelta(days=1)
MAX_PER_ACCOUNT = 10


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass(frozen=True)
class Endpoint:
    id: int
    account_id: int
    url: str
    secret: str
    created_at: dt.datetime


@dataclass(frozen=True)
class Delivery:
    id: int
    webhook_id: int
    message_id: str
    payload: dict[str, Any]
    created_at: dt.datetime
    attempts: int


class WebhookStore(PoolStore):
    async def create(self, account_id: int, url: str) -> tuple[int, str]:
        """A new endpoint of the account; its id and secret (shown once)."""
        secret = new_secret()
        rows = await self._all(
            "INSERT INTO web_webhooks (account_id, url, secret) "
            "VALUES (%(a)s, %(u)s, %(s)s) RETURNING id",
            {"a": account_id, "u": url, "s": secret},
        )
        return int(rows[0]["id"]), secret

    async def endpoints(self, account_id: int) -> list[Endpoint]:
        rows = await self._all(
            "SELECT id, account_id, url, secret, created_at FROM web_webhooks "
            "WHERE account_id = %(a)s ORDER BY id",
            {"a": account_id},
        )
        return [Endpoint(**r) for r in rows]

    async def remove(self, account_id: int, webhook_id: int) -> bool:
        rows = await self._all(
            "DELETE FROM web_webhooks WHERE id = %(id)s AND account_id = %(a)s RETURNING id",
            {"id": webhook_id, "a": account_id},
        )
        return bool(rows)

    async def watch(self, job_id: uuid.UUID) -> int:
        """Tell the end of a job of another front end by webhook too, as the jobs API's
        are told: when it ends, or now if it has ended. How many deliveries were queued
        now (0 while it runs)."""
        await self._all(
            "INSERT INTO webhook_jobs (job_id) SELECT id FROM jobs WHERE id = %(j)s "
            "ON CONFLICT DO NOTHING",
            {"j": job_id},
        )
        return await self.queue_job(job_id)

    async def queue_job(self, job_id: uuid.UUID) -> int:
        """Queue the events of a finished job for its account's endpoints (each once:
        calling again adds nothing); how many deliveries were queued."""
        rows = await self._all("SELECT comfyveil_queue_webhooks(%(j)s) AS n", {"j": job_id})
        return int(rows[0]["n"]) if rows else 0

    async def claim(self, *, hold_seconds: float, limit: int = 20) -> list[Endpoint]:
        """Endpoints with a delivery due and none in flight, each now held by the caller
        for `hold_seconds` (a sender that dies lets go when that passes)."""
        rows = await self._all(
            "UPDATE web_webhooks w SET busy_until = now() + make_interval(secs => %(h)s) "
            "WHERE w.id IN (SELECT x.id FROM web_webhooks x "
            "  WHERE (x.busy_until IS NULL OR x.busy_until < now()) AND EXISTS ("
            "    SELECT 1 FROM webhook_deliveries d WHERE d.webhook_id = x.id "
            "    AND d.delivered_at IS NULL AND d.given_up_at IS NULL AND d.next_at <= now()) "
            "  ORDER BY x.id LIMIT %(n)s FOR UPDATE SKIP LOCKED) "
            "RETURNING w.id, w.account_id, w.url, w.secret, w.created_at",
            {"h": hold_seconds, "n": limit},
        )
        return [Endpoint(**r) for r in rows]

    async def next_due(self, webhook_id: int) -> Delivery | None:
        rows = await self._all(
            "SELECT id, webhook_id, message_id, payload, created_at, attempts "
            "FROM webhook_deliveries WHERE webhook_id = %(w)s AND delivered_at IS NULL "
            "AND given_up_at IS NULL AND next_at <= now() ORDER BY next_at, id LIMIT 1",
            {"w": webhook_id},
        )
        return Delivery(**rows[0]) if rows else None

    async def delivered(self, delivery_id: int, status: int) -> None:
        await self._all(
            "UPDATE webhook_deliveries SET delivered_at = now(), attempts = attempts + 1, "
            "last_status = %(s)s WHERE id = %(id)s",
            {"id": delivery_id, "s": status},
        )

    async def failed(self, delivery_id: int, status: int | None, *, retry_in: float) -> bool:
        """Count a failed try; the next waits `retry_in` seconds, unless a day has passed
        since the event (then it is given up). True when given up."""
        rows = await self._all(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, last_status = %(s)s, "
            "next_at = now() + make_interval(secs => %(r)s), "
            "given_up_at = CASE WHEN created_at + %(g)s < now() + make_interval(secs => %(r)s) "
            "THEN now() END WHERE id = %(id)s RETURNING given_up_at IS NOT NULL AS given_up",
            {"id": delivery_id, "s": status, "r": retry_in, "g": GIVE_UP_AFTER},
        )
        return bool(rows and rows[0]["given_up"])

    async def release(self, webhook_id: int) -> None:
        await self._all(
            "UPDATE web_webhooks SET busy_until = NULL WHERE id = %(w)s", {"w": webhook_id}
        )

    async def deliveries(self, webhook_id: int) -> list[dict[str, Any]]:
        """The endpoint's deliveries, oldest first (for its owner's settings page, tests)."""
        return await self._all(
            "SELECT id, message_id, payload, attempts, last_status, delivered_at, given_up_at "
            "FROM webhook_deliveries WHERE webhook_id = %(w)s ORDER BY id",
            {"w": webhook_id},
        )
