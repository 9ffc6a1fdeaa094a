"""The anon process: start it, watch it bootstrap, restart it when it dies, stop it.

`ManagedAnon` runs our own anon (a SOCKS port for outgoing traffic, a control port for
hidden services); `daemon.AttachedAnon` uses a daemon the operator runs and starts
nothing. Both tell the hidden-service suffix they serve, read from the daemon itself;
`from_settings` picks the one the settings ask for.

    async with ManagedAnon(network=PrivateNetwork(...), binary=..., data_dir=...) as anon:
        proxy = anon.socks_url("gpu0")
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from comfyveil import config
from comfyveil import tasks as background
from comfyveil.anyone import control, errors, hidden, install, uploads
from comfyveil.anyone import network as network_mod
from comfyveil.anyone.daemon import AnonClient, AttachedAnon, suffix_for_version

logger = logging.getLogger(__name__)

BOOTSTRAP_TIMEOUT = 120.0
STOP_TIMEOUT = 10.0
RESTART_BACKOFF = (0.5, 30.0)  # first delay, longest delay
SOCKS_SOCKET = "socks.sock"
CONTROL_SOCKET = "control.sock"
MAX_SOCKET_PATH = 100  # bytes; sun_path holds 108 on Linux, 104 on macOS
ProgressCallback = Callable[[int, str], None]


class ManagedAnon(AnonClient):
    """Our own anon process, supervised: restarted with backoff whenever it dies."""

    def __init__(
        self,
        *,
        network: network_mod.Network | None,
        binary: Path,
        data_dir: Path,
        hidden_services: Sequence[hidden.HiddenServiceSpec] = (),
        client_keys: Iterable[Path] = (),
        bootstrap_timeout: float = BOOTSTRAP_TIMEOUT,
        supervise: bool = True,
        on_progress: ProgressCallback | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self._environ = environ
        # Refuse now, before anything is written: no network, or a forbidden public one.
        self.network = network_mod.check_allowed(network, environ)
        self.binary = binary
        self.data_dir = data_dir.expanduser().resolve()
        # Unix sockets inside the 0700 state directory: no other local user can reach
        # anon's circuits (with the client keys loaded) or take its port during a restart.
        # A state directory too deep for a socket path gets a private (0700) directory
        # with an unguessable name in the temporary folder instead, made at start.
        self.control_path: Path | None = None
        self._temp_socket_dir: Path | None = None
        if _fits(self.data_dir):
            self.socks_path = self.data_dir / SOCKS_SOCKET
            self.control_path = self.data_dir / CONTROL_SOCKET
        self.hidden_services = tuple(hidden_services)
        self.client_keys = tuple(client_keys)
        self.bootstrap_timeout = bootstrap_timeout
        self.supervise = supervise
        self.on_progress = on_progress
        self.control: control.ControlConnection | None = None
        self.version: str | None = None
        self.restarts = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._event_task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stopping = False
        self._uploads = uploads.DescriptorUploads()
        self._uploads_changed = asyncio.Condition()

    # -- public ------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.returncode is None else None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def start(self) -> None:
        """Start anon and wait until it is connected (100 % bootstrapped)."""
        network_mod.check_allowed(self.network, self._environ)
        self._stopping = False
        try:
            await self._launch()
        except BaseException:
            await self.stop()
            raise
        if self.supervise:
            self._supervisor = asyncio.create_task(self._supervise(), name="anon-supervisor")

    async def stop(self) -> None:
        self._stopping = True
        self._ready.clear()
        if self._supervisor:
            await background.cancel_and_wait([self._supervisor])
            self._supervisor = None
        await self._terminate()

    async def close(self) -> None:
        """Stop anon for good: also remove a temporary socket directory."""
        await self.stop()
        folder, self._temp_socket_dir = self._temp_socket_dir, None
        if folder is not None:
            self.socks_path = self.control_path = None
            await asyncio.to_thread(shutil.rmtree, folder, True)

    async def restart(self) -> None:
        """Stop anon and start it again on the same sockets and state."""
        await self.stop()
        await self.start()

    async def __aenter__(self) -> ManagedAnon:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_ready(self, within: float | None = None) -> None:
        """Wait until anon runs and is bootstrapped (again, after a restart)."""
        try:
            await background.wait_for(self._ready.wait(), within or self.bootstrap_timeout * 2)
        except TimeoutError as exc:
            raise errors.BootstrapTimeout() from exc

    def require_control(self) -> control.ControlConnection:
        if self.control is None or self.control.closed:
            raise errors.AnonError("anon is not running")
        return self.control

    def upload_count(self, service_id: str) -> int:
        """How many hidden-service descriptor uploads anon reported for this service."""
        return self._uploads.uploaded(service_id)

    async def wait_published(self, service_id: str, *, after: int = 0,
                             within: float = 120.0, everywhere: bool = False) -> None:
        """Wait for a descriptor upload beyond `after` uploads (see upload_count): the
        service can be found. `everywhere`: and for the uploads of that publication to
        every directory, so that no client can fetch the one before (after revoking a
        client, a directory not reached yet still serves a descriptor its key opens)."""
        def done() -> bool:
            return self.upload_count(service_id) > after and not (
                everywhere and self._uploads.on_the_way(service_id)
            )

        async def _wait() -> None:
            async with self._uploads_changed:
                await self._uploads_changed.wait_for(done)

        try:
            await background.wait_for(_wait(), within)
        except TimeoutError as exc:
            raise errors.HiddenServiceError(
                "the hidden service was not published in time"
            ) from exc

    def address_of(self, spec: hidden.HiddenServiceSpec) -> str:
        """A persistent service's address, e.g. 'abc...xyz.anon'."""
        return hidden.read_address(spec.directory)

    async def add_ephemeral(
        self, target: str, *, port: int = 80, client_auth_v3: Iterable[str] = (),
        wait: bool = True, within: float = 120.0,
    ) -> str:
        """Publish a temporary hidden service (gone when anon stops); returns its address."""
        conn = self.require_control()
        service = await conn.add_onion({port: target}, client_auth_v3=client_auth_v3,
                                       discard_key=True)
        if wait:
            await self.wait_published(service.service_id, within=within)
        return service.service_id + (self.suffix or ".anon")

    async def remove_ephemeral(self, address: str) -> None:
        service_id, _ = hidden.split_address(address)
        await self.require_control().del_onion(service_id)

    async def add_client_key(self, key_file: Path) -> hidden.ClientKey:
        """Use a hidden service's client key now (and after restarts)."""
        key = hidden.read_client_key_file(key_file)
        if key_file not in self.client_keys:
            self.client_keys += (key_file,)
        await asyncio.to_thread(self._install_client_keys)
        # anon 0.4.9 accepts ONION_CLIENT_AUTH_ADD but then still fails to decrypt the
        # descriptor; re-reading ClientOnionAuthDir (RELOAD) works, so we use that.
        conn = self.require_control()
        await conn.signal("RELOAD")
        await conn.signal("NEWNYM")
        return key

    async def revoke_client(self, spec: hidden.HiddenServiceSpec, name: str) -> bool:
        """Withdraw client NAME's access to a persistent service; True if it had access.

        A reload would republish the descriptor, but clients that cached the old one keep
        working through the same introduction points; a restart replaces those too.
        """
        removed = await asyncio.to_thread(hidden.revoke_client, spec.directory, name)
        if removed and self._proc is not None:
            await self.restart()
        return removed

    async def reload(self) -> None:
        """Make anon re-read its configuration (e.g. a revoked client)."""
        await self.require_control().signal("RELOAD")

    async def new_identity(self) -> None:
        """New circuits and a fresh hidden-service descriptor cache."""
        await self.require_control().signal("NEWNYM")

    # -- internals ---------------------------------------------------------------------

    def _anonrc(self) -> str:
        lines = [
            "AgreeToTerms 1",
            f"DataDirectory {self.data_dir}",
            f"Log notice file {self.data_dir / 'notice.log'}",
            # No GroupWritable/WorldWritable/RelaxDirModeCheck: anon itself then refuses
            # to listen unless the directory is private. ExtendedErrors: a hidden
            # service that refuses us says why (missing client key, no descriptor...).
            f"SocksPort {_unix_port(self.socks_path)} ExtendedErrors",
            f"ControlPort {_unix_port(self.control_path)}",
            f"ControlPortWriteToFile {self.data_dir / 'control-port'}",
            "CookieAuthentication 1",
            f"ClientOnionAuthDir {self.data_dir / 'onion-auth'}",
            # anon exits by itself if this program dies, so it never outlives us.
            f"__OwningControllerProcess {os.getpid()}",
            "ShutdownWaitLength 0",
        ]
        for name, option in (("geoip", "GeoIPFile"), ("geoip6", "GeoIPv6File")):
            path = self.binary.parent / name
            if path.is_file():
                lines.append(f"{option} {path}")
        for spec in self.hidden_services:
            lines.append(f"HiddenServiceDir {spec.directory.resolve()}")
            lines.append(f"HiddenServicePort {spec.port} {spec.target}")
            if spec.pow_defense:
                lines.append("HiddenServicePoWDefensesEnabled 1")
        lines += self.network.anonrc_lines()
        return "\n".join(lines) + "\n"

    def _install_client_keys(self) -> None:
        folder = self.data_dir / "onion-auth"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder.chmod(0o700)
        for path in self.client_keys:
            key = hidden.read_client_key_file(path)
            dest = folder / f"{key.service_id}.auth_private"
            hidden.write_client_key_file(dest, key.service_id, key.private_key)

    def _prepare(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.data_dir.chmod(0o700)
        for spec in self.hidden_services:
            hidden.prepare_dir(spec.directory)
        self._install_client_keys()
        if self.socks_path is None:
            self._temp_socket_dir = Path(tempfile.mkdtemp(prefix="comfyveil-anon-"))
            self.socks_path = self._temp_socket_dir / SOCKS_SOCKET
            self.control_path = self._temp_socket_dir / CONTROL_SOCKET
        assert self.control_path is not None
        for stale in (self.data_dir / "control-port", self.socks_path, self.control_path):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        text = self._anonrc()
        network_mod.check_anonrc(text, self._environ)
        path = self.data_dir / "anonrc"
        path.write_text(text)
        return path

    async def _launch(self) -> None:
        anonrc = await asyncio.to_thread(self._prepare)
        # The last line of defence: re-read what anon will actually get.
        network_mod.check_anonrc(await asyncio.to_thread(anonrc.read_text), self._environ)
        out = await asyncio.to_thread((self.data_dir / "anon.out").open, "ab")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                str(self.binary), "-f", str(anonrc),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )
        except OSError as exc:
            raise errors.AnonStartError(f"cannot run {self.binary}: {exc.strerror}") from exc
        finally:
            out.close()
        logger.info("anon started (pid %s)", self._proc.pid)
        try:
            await background.wait_for(self._connect_and_bootstrap(), self.bootstrap_timeout)
        except TimeoutError as exc:
            raise errors.BootstrapTimeout(
                f"anon did not connect to the Anyone network within "
                f"{self.bootstrap_timeout:.0f} s"
            ) from exc
        self._ready.set()

    def _failure_reason(self) -> str:
        for name in ("anon.out", "notice.log"):
            try:
                lines = (self.data_dir / name).read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in reversed(lines[-50:]):
                if "[err]" in line or "[warn]" in line:
                    return line.split("]", 1)[-1].strip()[:200]
        return "no reason given"

    async def _wait_control_port(self) -> Path:
        path = self.data_dir / "control-port"
        while True:
            if self._proc is None or self._proc.returncode is not None:
                raise errors.AnonStartError(
                    f"anon exited at start: {await asyncio.to_thread(self._failure_reason)}"
                )
            with contextlib.suppress(OSError):
                text = await asyncio.to_thread(path.read_text)
                match = re.search(r"^UNIX_PORT=(.+)$", text, re.M)
                if match:
                    return Path(match.group(1).strip())
            await asyncio.sleep(0.05)

    async def _connect_and_bootstrap(self) -> None:
        path = await self._wait_control_port()
        self.control = await control.ControlConnection.connect_unix(
            path, cookie_file=self.data_dir / "control_auth_cookie"
        )
        info = await self.control.getinfo("version", "net/listeners/socks")
        self.version = info["version"].split()[0]
        self.suffix = suffix_for_version(self.version)
        if f"unix:{self.socks_path}" not in info.get("net/listeners/socks", ""):
            raise errors.AnonStartError("anon opened no SOCKS socket")
        for spec in self.hidden_services:
            with contextlib.suppress(errors.HiddenServiceError):
                _, self.suffix = hidden.split_address(hidden.read_address(spec.directory))
        queue = self.control.subscribe("HS_DESC")
        await self.control.set_events(["HS_DESC"])
        if self._event_task:
            self._event_task.cancel()
        self._event_task = asyncio.create_task(self._watch_events(queue), name="anon-events")
        last = -1
        while True:
            phase = (await self.control.getinfo("status/bootstrap-phase"))[
                "status/bootstrap-phase"]
            match = re.search(r"PROGRESS=(\d+)", phase)
            progress = int(match.group(1)) if match else 0
            summary_match = re.search(r'SUMMARY="([^"]*)"', phase)
            summary = summary_match.group(1) if summary_match else ""
            if progress != last:
                last = progress
                logger.info("anon bootstrap %d%%: %s", progress, summary)
                if self.on_progress:
                    self.on_progress(progress, summary)
            if progress >= 100:
                return
            await asyncio.sleep(0.2)

    async def _watch_events(self, queue: asyncio.Queue[control.Event]) -> None:
        while True:
            event = await queue.get()
            parts = event.text.split()
            logger.debug("anon event: %s", " ".join(parts[:3]))
            if self._uploads.feed(event.text):
                async with self._uploads_changed:
                    self._uploads_changed.notify_all()

    async def _terminate(self) -> None:
        if self._event_task:
            await background.cancel_and_wait([self._event_task])
            self._event_task = None
        if self.control:
            await self.control.close()
            self.control = None
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await background.wait_for(proc.wait(), STOP_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        logger.info("anon stopped")

    async def _supervise(self) -> None:
        """Restart anon whenever it dies, for as long as we run: a failed restart, of
        whatever kind (a full disk, a control connection that hangs up mid-greeting),
        is retried with a growing delay, never the end of supervision."""
        delay = RESTART_BACKOFF[0]
        while not self._stopping:
            proc = self._proc
            if proc is not None:
                code = await proc.wait()
                if self._stopping:
                    return
                logger.warning("anon exited (code %s); restarting in %.1f s", code, delay)
            self._ready.clear()
            try:
                await self._terminate()
                await asyncio.sleep(delay)
                await self._launch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # No traceback at the default verbosity: a restart that fails is news, a
                # stack is not; -vv shows it.
                reason = str(exc) if isinstance(exc, errors.AnonError) else (
                    f"{type(exc).__name__}: {exc}")
                logger.warning("anon restart failed: %s; retrying in %.1f s", reason,
                               min(delay * 2, RESTART_BACKOFF[1]))
                logger.debug("anon restart failure", exc_info=True)
                with contextlib.suppress(Exception):
                    await self._terminate()
                delay = min(delay * 2, RESTART_BACKOFF[1])
                continue
            self.restarts += 1
            delay = RESTART_BACKOFF[0]
            logger.info("anon is back after a restart")


def _fits(folder: Path) -> bool:
    """Whether sockets in `folder` have paths the kernel (and anon) accept."""
    return len(str(folder / CONTROL_SOCKET).encode()) <= MAX_SOCKET_PATH


def _unix_port(path: Path | None) -> str:
    """An anonrc port value for a Unix socket, or a plain refusal of a path anon (or the
    kernel) cannot take."""
    assert path is not None
    text = str(path)
    if len(text.encode()) > MAX_SOCKET_PATH:
        raise errors.AnonStartError(
            f"the folder {path.parent} is too deep for anon's sockets (at most "
            f"{MAX_SOCKET_PATH} bytes per socket path): set TMPDIR to a shorter folder"
        )
    if any(c in text for c in '"\\\n'):
        raise errors.AnonStartError(
            f"the folder {path.parent} for anon's sockets has a quote, backslash or line "
            "break in its name: choose another data_dir"
        )
    return f'unix:"{text}"'


def state_dir(settings: config.Settings) -> Path:
    return settings.data_dir / "anon" / "state"


def from_settings(
    settings: config.Settings, *, network: network_mod.Network | None,
    hidden_services: Sequence[hidden.HiddenServiceSpec] = (),
    on_progress: ProgressCallback | None = None,
) -> AnonClient:
    """The anon the settings ask for: the operator's daemon, or our own (not started yet).

    Our own anon gets the client keys of every backend with auth_key_file.
    """
    if settings.anyone.socks:
        return AttachedAnon(socks=settings.anyone.socks, control_address=settings.anyone.control,
                            cookie_file=settings.anyone.cookie_file)
    return ManagedAnon(
        network=network,
        binary=install.find_binary(settings),
        data_dir=state_dir(settings),
        hidden_services=hidden_services,
        client_keys=[b.auth_key_file for b in settings.backend_list() if b.auth_key_file],
        on_progress=on_progress,
    )
