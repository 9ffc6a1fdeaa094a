"""anon for a running command: started only when something needs it, stopped at exit.

    async with runtime.anon_for(settings, backends) as router:
        client = ComfyClient(backend.url, name=backend.name, proxy=router.proxy_for(backend))

A backend needs anon when `routing.proxy_url_for` says so (a hidden-service host, or
via = "anyone"); Bot API traffic needs it when [anyone] telegram is on. Nothing needs it:
no process is started and every proxy is None.

Which network our own anon joins is never a silent default in tests: an explicit
`network` argument wins, then [anyone] private_network (a file of DirAuthority lines),
and only then the public network, which the process manager refuses wherever
COMFYVEIL_ANYONE_FORBID_PUBLIC is set (the whole test suite). With [anyone] socks set we
start nothing and use the operator's daemon.

Several comfyveil commands may run on one host at once (the bot, a `generate`); each
managed anon gets a state directory of its own, held with a lock for its lifetime.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from comfyveil import config
from comfyveil.anyone import daemon, errors, hidden, install, process, routing
from comfyveil.anyone import network as network_mod

logger = logging.getLogger(__name__)

MAX_STATE_DIRS = 16  # anon processes of comfyveil one host may run side by side
NEWNYM_INTERVAL = 10.0  # seconds; anon ignores NEWNYM signals closer together than this


@dataclass(frozen=True)
class Router:
    """Hands out proxy URLs: `proxy_for(backend)` is the pool's and the clients' hook."""

    anon: daemon.AnonClient | None
    settings: config.Settings
    _last_newnym: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    def proxy_for(self, backend: config.BackendConfig) -> str | None:
        """The SOCKS URL for this backend (its own circuits), or None for a direct line."""
        return routing.proxy_url_for(backend, self.anon)

    def telegram_proxy(self) -> str | None:
        """python-telegram-bot's proxy when [anyone] telegram is on, else None."""
        return routing.telegram_proxy_url(self.settings, self.anon)

    async def backend_down(self, backend: config.BackendConfig) -> None:
        """A backend reached through anon failed: ask anon for new circuits and a fresh
        hidden-service descriptor before the next try (a stale descriptor or a dead
        introduction point otherwise keeps failing). At most once per NEWNYM_INTERVAL,
        anon's own limit; an anon we do not control is left alone."""
        new_identity = getattr(self.anon, "new_identity", None)
        if new_identity is None or self.proxy_for(backend) is None:
            return
        now = time.monotonic()
        if now - self._last_newnym.get("at", -NEWNYM_INTERVAL) < NEWNYM_INTERVAL:
            return
        self._last_newnym["at"] = now
        try:
            await new_identity()
        except errors.AnonError as exc:
            logger.info("could not renew anon's circuits: %s", exc,
                        extra={"action": "newnym_failed"})


def _routed(backend: config.BackendConfig) -> bool:
    try:
        return routing.proxy_url_for(backend, None) is not None
    except errors.AnonError:
        return True


def needs_anon(
    settings: config.Settings, backends: Sequence[config.BackendConfig], *,
    telegram: bool = False,
) -> list[str]:
    """What needs anon, in words (empty: nothing; anon is not started)."""
    needs = [f"backend {b.name}" for b in backends if _routed(b)]
    if telegram and settings.anyone.telegram:
        needs.append("Telegram ([anyone] telegram)")
    return needs


def choose_network(
    settings: config.Settings, network: network_mod.Network | None = None
) -> network_mod.Network:
    """The explicit network, else [anyone] private_network, else the public network."""
    if network is not None:
        return network
    if settings.anyone.private_network is not None:
        return network_mod.PrivateNetwork.from_file(settings.anyone.private_network)
    return network_mod.PublicNetwork()


def _key_files(
    settings: config.Settings, backends: Sequence[config.BackendConfig]
) -> list[Path]:
    files: list[Path] = []
    for backend in (*settings.backends, *backends):
        if backend.auth_key_file and backend.auth_key_file not in files:
            files.append(backend.auth_key_file)
    for path in files:  # refuse a missing or world-readable key before anon starts
        hidden.read_client_key_file(path)
    return files


@contextlib.contextmanager
def _state_dir(base: Path) -> Iterator[Path]:
    """The first of base, base-1, ... that no other comfyveil process holds."""
    base.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for index in range(MAX_STATE_DIRS):
        path = base if index == 0 else base.with_name(f"{base.name}-{index}")
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield path
        finally:
            os.close(fd)  # closing releases the lock
        return
    raise errors.AnonStartError(
        f"{MAX_STATE_DIRS} comfyveil anon processes already run on this host"
    )


@contextlib.asynccontextmanager
async def anon_for(
    settings: config.Settings,
    backends: Sequence[config.BackendConfig],
    *,
    network: network_mod.Network | None = None,
    telegram: bool = False,
    on_progress: process.ProgressCallback | None = None,
    bootstrap_timeout: float = process.BOOTSTRAP_TIMEOUT,
    hidden_services: Sequence[hidden.HiddenServiceSpec] = (),
    also: Sequence[str] = (),
) -> AsyncIterator[Router]:
    """Run anon for as long as the block runs, if `backends` (or Telegram) need it.

    Args:
        settings: the loaded settings ([anyone] and the configured backends' key files).
        backends: the backends this command will talk to.
        network: the network our anon joins; tests always pass their PrivateNetwork.
        telegram: whether this command talks to the Bot API (then [anyone] telegram counts).
        on_progress: called with (percent, summary) while anon bootstraps.
        hidden_services: persistent services our anon publishes (the web front end's).
        also: other traffic that needs anon, in words ("model downloads"); it takes its
            own circuits with `router.anon.socks_url(name)`.

    Raises:
        AnonError: a backend needs anon but [anyone] enabled is false, anon is not
            installed, a client key file is unusable, or anon did not start.
    """
    needs = needs_anon(settings, backends, telegram=telegram)
    needs += [f"the hidden service in {spec.directory.name}" for spec in hidden_services]
    needs += list(also)
    if not needs:
        yield Router(None, settings)
        return
    if not settings.anyone.enabled:
        raise errors.AnonError(
            f"{needs[0]} is reached through the Anyone network, but [anyone] enabled is false"
        )
    if settings.anyone.socks and hidden_services:
        raise errors.AnonError(
            "[anyone] socks names an anon comfyveil does not run, so it cannot publish "
            f"{needs[-1]}; publish it with that daemon's own HiddenServiceDir instead"
        )
    if settings.anyone.socks:
        async with daemon.AttachedAnon(
            socks=settings.anyone.socks, control_address=settings.anyone.control,
            cookie_file=settings.anyone.cookie_file,
        ) as attached:
            logger.info("using the operator's anon at %s", settings.anyone.socks)
            yield Router(attached, settings)
        return
    chosen = choose_network(settings, network)
    network_mod.check_allowed(chosen)  # refuse before anything is written
    binary = install.find_binary(settings)
    keys = _key_files(settings, backends)
    with _state_dir(process.state_dir(settings)) as data_dir:
        anon = process.ManagedAnon(
            network=chosen, binary=binary, data_dir=data_dir, client_keys=keys,
            on_progress=on_progress, bootstrap_timeout=bootstrap_timeout,
            hidden_services=hidden_services,
        )
        logger.info("starting anon for %s", ", ".join(needs))
        async with anon:
            yield Router(anon, settings)
