"""The metrics listener: `GET /metrics`, `/healthz` and `/readyz` on ``[metrics] host``
and ``port`` (127.0.0.1:9464), its own socket: never the web front end's port, never a
hidden service. A worker host's Prometheus scrapes its own worker there.

/metrics first reads what lives in the database (jobs queued and running, workers alive)
and what this process knows of its backends, then renders the registry. /readyz answers
200 "ready" or 503 with the first reason it is not (the database does not answer, no
backend is up, this worker's heartbeat, written with its lease renewals, has stopped).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from comfyveil import hosts, metrics
from comfyveil.errors import ConfigError
from comfyveil.store import errors as store_errors

logger = logging.getLogger(__name__)

DB_TIMEOUT = 2.0  # seconds a scrape or a probe waits for the database


@dataclass
class Parts:
    """What this process runs, for the scrape and the probes (None: not here)."""

    db: Any = None  # store.database.Database
    pool: Any = None  # comfy.pool.Pool
    heartbeat: Any = None  # worker.heartbeat.Heartbeat
    lease_seconds: float = 30.0


class MetricsServer:
    """Serves the registry and the probes until `close()`."""

    def __init__(self, host: str, port: int, parts: Parts) -> None:
        self.host = host
        self.port = port
        self.parts = parts
        self._runner: web.AppRunner | None = None
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application(  # GETs only: no body to read
            client_max_size=1024,
            middlewares=[hosts.middleware(lambda: (self.host, *hosts.own_names()))],
        )
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(
                f"[metrics] cannot listen on {self.host}:{self.port}: {exc.strerror}"
            ) from exc
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{port}"
        logger.info("metrics at %s/metrics", self.url, extra={"action": "metrics_listening"})
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- handlers ----------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        await self.refresh()
        body = generate_latest(metrics.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="alive\n")

    async def readyz(self, request: web.Request) -> web.Response:
        reason = await self.not_ready()
        if reason is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {reason}\n")

    # --- what they read ----------------------------------------------------------

    async def refresh(self) -> None:
        """Set the gauges read at scrape time; a database that does not answer leaves the
        last values (the scrape still answers, with the process' own counters)."""
        pool = self.parts.pool
        if pool is not None:
            for backend in pool.backends.values():
                metrics.BACKEND_UP.labels(backend=metrics.label(backend.name)).set(
                    1 if backend.healthy else 0
                )
                metrics.BACKEND_BUSY.labels(backend=metrics.label(backend.name)).set(backend.load)
        db = self.parts.db
        if db is None:
            return
        try:
            async with asyncio.timeout(DB_TIMEOUT):
                counts = await db.heartbeats.scrape_counts(self.parts.lease_seconds)
        except (TimeoutError, store_errors.StoreError) as exc:
            logger.info("metrics: the database did not answer: %s", type(exc).__name__)
            return
        for state in ("queued", "running"):
            metrics.QUEUE.labels(state=state).set(counts.get(state, 0))
        metrics.WORKERS.set(counts.get("alive", 0))

    async def not_ready(self) -> str | None:
        """Why this process is not ready (None: it is)."""
        db = self.parts.db
        if db is not None:
            try:
                async with asyncio.timeout(DB_TIMEOUT):
                    await db.heartbeats.queue_counts()
            except (TimeoutError, store_errors.StoreError):
                return "the database does not answer"
        pool = self.parts.pool
        if pool is not None and not pool.any_healthy:
            return "no backend is up"
        beat = self.parts.heartbeat
        if beat is not None:
            quiet = time.monotonic() - beat.last_success
            if quiet > self.parts.lease_seconds:
                return f"this worker has not renewed its heartbeat for {quiet:.0f} s"
        return None
