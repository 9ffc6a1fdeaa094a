"""The last node and model lists (/object_info) each backend answered, kept so a process
that starts while a GPU is down still knows what that GPU lacks (the pool uses them until
the backend answers; see `comfy.health.ModelMemory`)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from comfyveil import config
from comfyveil.store import errors
from comfyveil.store.connector import Connector

logger = logging.getLogger(__name__)


def _url_hash(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


class ModelListStore:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.db = Connector(pool)

    async def remember(self, backend: config.BackendConfig, info: Mapping[str, Any]) -> None:
        """Keep `info` as `backend`'s lists. A database that does not answer costs only
        the memory: the pool goes on."""
        try:
            await self.db.run(
                "remember_model_lists",
                backend=backend.name[:200],
                url_hash=_url_hash(backend.url),
                object_info=Jsonb(dict(info)),
            )
        except errors.StoreError as exc:
            logger.info(
                "could not keep the model lists of backend %s: %s",
                backend.name,
                exc,
                extra={"action": "model_lists_unsaved", "backend": backend.name},
            )

    async def recall(
        self, backends: Sequence[config.BackendConfig]
    ) -> dict[str, Mapping[str, Any]]:
        """The lists last kept for these backends (by name), those read from the URL each
        has now; {} when the database does not answer."""
        try:
            rows = await self.db.all("recall_model_lists", backends=[b.name for b in backends])
        except errors.StoreError as exc:
            logger.info(
                "could not read the kept model lists: %s",
                exc,
                extra={"action": "model_lists_unread"},
            )
            return {}
        urls = {b.name: _url_hash(b.url) for b in backends}
        return {
            row["backend"]: row["object_info"]
            for row in rows
            if urls.get(row["backend"]) == row["url_hash"] and isinstance(row["object_info"], dict)
        }
