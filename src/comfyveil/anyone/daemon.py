"""What comfyveil needs from a running anon (`AnonClient`: its SOCKS port and the
hidden-service suffix it serves, read from the daemon itself), and `AttachedAnon`, a daemon
the operator runs, of which we only use the ports and start nothing. Our own supervised
anon is `process.ManagedAnon`."""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from urllib.parse import quote

from comfyveil import proxy
from comfyveil.anyone import control, errors, hidden


def suffix_for_version(version: str) -> str:
    """The hidden-service suffix of an anon version: .anon up to 0.4.9, .anyone from 0.4.10."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if not match:
        raise errors.AnonError(f"cannot tell anon's version from {version!r}")
    major, minor, micro = (int(g) for g in match.groups())
    return ".anyone" if (major, minor, micro) >= (0, 4, 10) else ".anon"


class AnonClient:
    """What the rest of comfyveil needs from a running anon: its SOCKS port and suffix.

    The SOCKS port is a Unix socket (`socks_path`, our own anon) or a TCP port
    (`socks_host`:`socks_port`, an operator's daemon configured that way).
    """

    socks_host: str = "127.0.0.1"
    socks_port: int | None = None
    socks_path: Path | None = None
    suffix: str | None = None  # None when the daemon could not be asked
    version: str | None = None

    def __init__(self) -> None:
        # Part of every SOCKS password, so circuits are never shared with another program.
        self.isolation_secret = secrets.token_hex(8)

    @property
    def hidden_suffixes(self) -> tuple[str, ...]:
        return (self.suffix,) if self.suffix else hidden.KNOWN_SUFFIXES

    def serves(self, suffix: str) -> bool:
        """Whether this daemon can reach hidden services whose addresses end in `suffix`."""
        return self.suffix is None or suffix == self.suffix

    def socks_url(self, isolation: str = "default") -> str:
        """A socks5h:// URL: the hostname goes to anon, never to local DNS.

        Each distinct `isolation` name gets its own circuits (IsolateSOCKSAuth).
        """
        user = f"comfyveil-{isolation}"
        if self.socks_path is not None:
            return proxy.unix_url(str(self.socks_path), user, self.isolation_secret)
        if self.socks_port is None:
            raise errors.AnonError("the Anyone client has no SOCKS port yet")
        return (f"socks5h://{quote(user, safe='')}:{self.isolation_secret}"
                f"@{self.socks_host}:{self.socks_port}")


def _split_hostport(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise errors.AnonError(
            f"{what} must look like 127.0.0.1:PORT or unix:/path, not {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class AttachedAnon(AnonClient):
    """An anon (or Tor) daemon the operator runs: we only use its ports."""

    def __init__(self, *, socks: str, control_address: str | None = None,
                 cookie_file: Path | None = None) -> None:
        super().__init__()
        if socks.startswith("unix:"):
            self.socks_path = Path(socks.removeprefix("unix:")).expanduser()
        else:
            self.socks_host, self.socks_port = _split_hostport(socks, "anyone.socks")
        self._control_address = control_address
        self._control_path = (
            Path(control_address.removeprefix("unix:")).expanduser()
            if control_address and control_address.startswith("unix:") else None
        )
        self._cookie_file = cookie_file
        self.control: control.ControlConnection | None = None
        self.version: str | None = None

    def serves(self, suffix: str) -> bool:
        # A Tor daemon reports a version like anon's, so the suffix read from it may be
        # wrong for .onion: the operator who configured a .onion backend knows better.
        return suffix == ".onion" or super().serves(suffix)

    async def start(self) -> None:
        if self._control_path is not None:
            self.control = await control.ControlConnection.connect_unix(
                self._control_path, cookie_file=self._cookie_file
            )
        elif self._control_address:
            host, port = _split_hostport(self._control_address, "anyone.control")
            self.control = await control.ControlConnection.connect(
                host, port, cookie_file=self._cookie_file
            )
            self.version = (await self.control.getinfo("version"))["version"]
            self.suffix = suffix_for_version(self.version)

    async def stop(self) -> None:
        if self.control:
            await self.control.close()
            self.control = None

    async def __aenter__(self) -> AttachedAnon:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
