"""An embedded PostgreSQL server (the `pgserver` wheel) for installs without DATABASE_URL.

pgserver is blocking (it runs initdb and pg_ctl), so every call goes through
`asyncio.to_thread`. The server listens on a Unix socket inside its data directory only,
never on a TCP port. Several `Database` objects in one process share one server; it is
stopped when the last of them releases it, and pgserver itself leaves it running while
another process still uses it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings
from pathlib import Path
from typing import Any

from comfyveil.store import errors

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_users: dict[Path, int] = {}
_servers: dict[Path, Any] = {}


def _start(data_dir: Path) -> str:
    with warnings.catch_warnings():
        # platformdirs warns about XDG_RUNTIME_DIR at import; irrelevant here.
        warnings.simplefilter("ignore")
        import pgserver

    data_dir = data_dir.expanduser().resolve()
    with _lock:
        server = _servers.get(data_dir)
        if server is None:
            data_dir.parent.mkdir(parents=True, exist_ok=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                server = pgserver.get_server(data_dir, cleanup_mode="stop")
            _servers[data_dir] = server
        _users[data_dir] = _users.get(data_dir, 0) + 1
        return str(server.get_uri())


def _stop(data_dir: Path) -> None:
    data_dir = data_dir.expanduser().resolve()
    with _lock:
        count = _users.get(data_dir, 0) - 1
        if count > 0:
            _users[data_dir] = count
            return
        _users.pop(data_dir, None)
        server = _servers.pop(data_dir, None)
    if server is not None:
        server.cleanup()


class EmbeddedServer:
    """A handle on the embedded server in one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.url: str | None = None

    async def start(self) -> str:
        """Start the server (or join the running one) and return its connection URL."""
        if self.url is not None:
            return self.url
        try:
            self.url = await asyncio.to_thread(_start, self.data_dir)
        except Exception as exc:  # pgserver raises plain subprocess/OS/assertion errors
            raise errors.EmbeddedServerError(
                f"the embedded PostgreSQL in {self.data_dir} could not be started "
                f"({type(exc).__name__}); see {self.data_dir / 'log'}"
            ) from exc
        logger.info("embedded PostgreSQL ready", extra={"action": "embedded_pg_started"})
        return self.url

    async def stop(self) -> None:
        """Release the server; it stops when nothing else uses it."""
        if self.url is None:
            return
        self.url = None
        try:
            await asyncio.to_thread(_stop, self.data_dir)
        except Exception:  # stopping is best effort; pgserver's atexit hook retries
            logger.warning("the embedded PostgreSQL did not stop cleanly", exc_info=True)
