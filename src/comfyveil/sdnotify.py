"""systemd's readiness protocol (sd_notify) for `Type=notify` units: READY=1 once the
service is up, WATCHDOG=1 while it is healthy, STOPPING=1 on the way out.

One datagram on the Unix socket named by $NOTIFY_SOCKET, a dozen lines: written here
rather than taken from the `sdnotify` package, whose last release is from 2017, or from
libsystemd bindings, which need a C build. Outside systemd ($NOTIFY_SOCKET unset) every
call does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

logger = logging.getLogger(__name__)


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send `state` ("READY=1", ...) to systemd; False when not run by it or it failed."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket: a NUL byte instead of the @
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        logger.warning("cannot tell systemd %s: %s", state.split("=")[0], exc.strerror)
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between two WATCHDOG=1 (half of WatchdogSec=), or None without a watchdog."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) <= 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2


async def watchdog() -> None:
    """Pet systemd's watchdog while the event loop runs; with none, return at once.

    Only a hung loop stops the petting (systemd then restarts the service): a database or
    backend outage does not, since the process rides those out itself.
    """
    interval = watchdog_interval()
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
