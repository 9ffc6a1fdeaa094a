"""Delivering the webhook outbox (store/webhooks.py), in the web process, beside and apart
from every request and worker: woken by the store's NOTIFY when deliveries are queued,
it takes endpoints with a delivery due (one in flight per endpoint, whichever process),
signs each delivery in the Standard Webhooks scheme (``webhook-id``,
``webhook-timestamp``, ``webhook-signature``: what OpenAI's SDK verifies) and posts it.

A receiver costs nothing else: each try has a deadline, redirects are not followed (a
3xx is a failure), at most a few KB of its answer are read, and a failure waits longer
each time (10 s doubling, at most an hour) until a day has passed. Payloads carry ids
and states, never a prompt; nothing of a payload or secret is logged."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import uuid
from collections.abc import Callable

import aiohttp
from standardwebhooks import Webhook

from comfyveil import errors, proxy
from comfyveil import tasks as background
from comfyveil.desk import webhook_targets
from comfyveil.store import database
from comfyveil.store import webhooks as store

logger = logging.getLogger(__name__)

TIMEOUT = 10.0  # seconds for one try, connect to answer read
HOLD = 60.0  # seconds an endpoint is held by a sender (longer than a try)
ANSWER_BYTES = 4096  # of a receiver's answer read (its status is what counts)
FIRST_RETRY = 10.0
MAX_RETRY = 3600.0
POLL = 5.0  # seconds between looks for retries come due, without news
PARALLEL = 8  # endpoints sent to at once by one process
USER_AGENT = "comfyveil-webhooks"


async def client_went_away(db: database.Database, job_id: uuid.UUID) -> None:
    """The hook for a request of the images API whose client went away: its job's end
    (succeeded, failed or cancelled) reaches the account's webhook endpoints, as a job
    of the jobs API does. Safe to call more than once, before or after the job ends."""
    await store.WebhookStore(db.pool).watch(job_id)


def retry_in(attempts: int) -> float:
    """Seconds before the next try after `attempts` failed ones (1: the first failed)."""
    return min(MAX_RETRY, FIRST_RETRY * 2 ** max(0, attempts - 1))


def headers_for(secret: str, message_id: str, body: str, now: dt.datetime) -> dict[str, str]:
    signature = Webhook(secret).sign(message_id, now, body)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
    }


class Sender:
    def __init__(
        self,
        db: database.Database,
        *,
        private_ok: bool,
        via_anon: bool = False,
        proxy_url: Callable[[], str | None] | None = None,
    ) -> None:
        self.db = db
        self.store = store.WebhookStore(db.pool)
        self.private_ok = private_ok
        self.via_anon = via_anon
        self.proxy_url = proxy_url  # anon's SOCKS URL for webhooks, asked when first sending
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self.sent = asyncio.Event()  # set after each try (tests wait on it)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="api-webhooks")

    async def close(self) -> None:
        if self._task is not None:
            await background.cancel_and_wait([self._task])
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession | None:
        """The client deliveries leave by; None while they must go through anon and anon
        is not there (they wait: never sent directly instead)."""
        if self._session is None:
            via = self.proxy_url() if self.proxy_url is not None and self.via_anon else None
            if self.via_anon and via is None:
                logger.warning(
                    'webhooks_via = "anon", but the Anyone client is not running: webhooks wait',
                    extra={"action": "webhooks_no_anon"},
                )
                return None
            self._session = aiohttp.ClientSession(
                connector=proxy.connector(via, limit=PARALLEL),
                timeout=aiohttp.ClientTimeout(total=TIMEOUT),
                # no cookies kept between receivers, no environment proxy
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
        return self._session

    async def _listen(self) -> None:
        while True:
            try:
                async with self.db.listen([store.CHANNEL]) as listener:
                    self._wake.set()  # what was queued before this took hold
                    async for _note in listener:
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the poll goes on meanwhile
                logger.warning(
                    "webhooks could not listen for news: %s",
                    type(exc).__name__,
                    extra={"action": "webhooks_listen_failed"},
                )
                await asyncio.sleep(1.0)

    async def _run(self) -> None:
        """Claim endpoints as they come due and send to each in its own task, so one
        that is slow to answer holds up no other."""
        listening = asyncio.create_task(self._listen(), name="api-webhooks-listen")
        running: set[asyncio.Task[None]] = set()

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            self._wake.set()  # room for another endpoint, or more due on this one

        try:
            while True:
                self._wake.clear()
                room = PARALLEL - len(running)
                claimed: list[store.Endpoint] = []
                if room > 0:
                    try:
                        claimed = await self.store.claim(hold_seconds=HOLD, limit=room)
                    except errors.ComfyveilError as exc:
                        logger.warning("webhooks: the outbox could not be read: %s", exc)
                for endpoint in claimed:
                    task = asyncio.create_task(self._endpoint(endpoint), name="api-webhook")
                    running.add(task)
                    task.add_done_callback(finished)
                if claimed and len(running) < PARALLEL:
                    continue  # more may be due at once
                with contextlib.suppress(TimeoutError):
                    await background.wait_for(self._wake.wait(), POLL)
        finally:
            await background.cancel_and_wait([listening, *running])

    async def _endpoint(self, endpoint: store.Endpoint) -> None:
        try:
            delivery = await self.store.next_due(endpoint.id)
            if delivery is not None:
                await self._deliver(endpoint, delivery)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the endpoint is let go; its delivery is tried again
            logger.warning(
                "webhook delivery failed on our side: %s",
                type(exc).__name__,
                extra={"action": "webhook_error"},
            )
        finally:
            with contextlib.suppress(Exception):
                await self.store.release(endpoint.id)
            self.sent.set()

    async def _deliver(self, endpoint: store.Endpoint, delivery: store.Delivery) -> None:
        body = json.dumps(delivery.payload, separators=(",", ":"))
        status: int | None = None
        try:
            await webhook_targets.check(
                endpoint.url, private_ok=self.private_ok, resolve=not self.via_anon
            )
            status = await self._post(endpoint, delivery, body)
        except webhook_targets.TargetRefused:
            status = None
        except (aiohttp.ClientError, TimeoutError, *proxy.ERRORS):
            status = None
        if status is not None and 200 <= status < 300:
            await self.store.delivered(delivery.id, status)
            logger.info(
                "webhook delivered",
                extra={"action": "webhook_delivered", "webhook": endpoint.id},
            )
            return
        given_up = await self.store.failed(
            delivery.id, status, retry_in=retry_in(delivery.attempts + 1)
        )
        logger.info(
            "webhook delivery failed%s",
            "; given up" if given_up else "; it will be tried again",
            extra={"action": "webhook_failed", "webhook": endpoint.id, "status": status},
        )

    async def _post(self, endpoint: store.Endpoint, delivery: store.Delivery, body: str) -> int:
        http = self._http()
        if http is None:
            raise aiohttp.ClientConnectionError("no way out")
        headers = headers_for(endpoint.secret, delivery.message_id, body, dt.datetime.now(dt.UTC))
        async with http.post(
            endpoint.url, data=body.encode(), headers=headers, allow_redirects=False
        ) as response:
            await response.content.read(ANSWER_BYTES)  # no more of it is read
            return response.status
