"""Which Anyone network an anon process joins: an explicit choice, never a default.

The anon binary knows the public network's directory authorities. A process started
without the private network's `DirAuthority` lines would reach out to the internet, so
the process manager demands a `PrivateNetwork` (loopback-only, with its authorities)
or an explicit `PublicNetwork()`, and refuses the public one when
COMFYVEIL_ANYONE_FORBID_PUBLIC=1 is set (as the test suite does).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from comfyveil.anyone import errors

FORBID_PUBLIC_ENV = "COMFYVEIL_ANYONE_FORBID_PUBLIC"

# Options a private network must keep as we set them: overriding one could leave loopback.
_GUARDED = frozenset({
    "testingtornetwork", "dirauthority", "usedefaultfallbackdirs", "outboundbindaddress",
    "fallbackdir", "bridge", "usebridges", "alternatedirauthority", "outboundbindaddressor",
    "outboundbindaddressexit", "outboundbindaddresspt", "socks5proxy", "httpsproxy",
    "socks4proxy", "clienttransportplugin",
})
_ADDRESS = re.compile(r"\b(\d{1,3}(?:\.\d{1,3}){3}):\d+\b")


@dataclass(frozen=True)
class PrivateNetwork:
    """A private Anyone network on 127.0.0.1 (tests): its directory authorities' lines."""

    dir_authorities: tuple[str, ...]  # the values of DirAuthority lines, without the keyword
    extra: tuple[str, ...] = ()  # more anonrc lines, e.g. test-network timing options

    def __post_init__(self) -> None:
        if not self.dir_authorities:
            raise errors.NetworkNotChosen(
                "a private network needs its DirAuthority lines; without them anon would "
                "join the public network"
            )
        for line in self.dir_authorities:
            addresses = _ADDRESS.findall(line)
            if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
                raise errors.NetworkNotChosen(
                    "a private network's directory authorities must be on 127.0.0.1"
                )
        for line in self.extra:
            key = line.split(None, 1)[0].lower() if line.strip() else ""
            if key in _GUARDED:
                raise errors.NetworkNotChosen(
                    f"{line.split(None, 1)[0]} cannot be overridden on a private network"
                )

    @classmethod
    def from_file(cls, path: Path) -> PrivateNetwork:
        """Read `DirAuthority ...` lines (other lines become extra options)."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise errors.NetworkNotChosen(f"cannot read network file {path}") from exc
        auths, extra = [], []
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.split(None, 1)[0].lower() == "dirauthority":
                auths.append(line.split(None, 1)[1])
            else:
                extra.append(line)
        return cls(tuple(auths), tuple(extra))

    def to_file_text(self) -> str:
        return "".join(f"DirAuthority {a}\n" for a in self.dir_authorities) + "".join(
            f"{e}\n" for e in self.extra
        )

    def anonrc_lines(self) -> list[str]:
        lines = [
            "TestingTorNetwork 1",
            "UseDefaultFallbackDirs 0",
            "OutboundBindAddress 127.0.0.1",
            "ClientUseIPv6 0",
            "PathsNeededToBuildCircuits 0.67",
            "VanguardsLiteEnabled 0",
        ]
        lines += [f"DirAuthority {a}" for a in self.dir_authorities]
        lines += list(self.extra)
        return lines


@dataclass(frozen=True)
class PublicNetwork:
    """The public Anyone network: an explicit opt-in, refused where it is forbidden."""

    def anonrc_lines(self) -> list[str]:
        return []


Network = PrivateNetwork | PublicNetwork


def public_forbidden(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(FORBID_PUBLIC_ENV, "").strip().lower() not in {"", "0", "false", "no"}


def check_allowed(network: object, environ: Mapping[str, str] | None = None) -> Network:
    """Return `network` if anon may start on it; refuse a missing or forbidden one."""
    if not isinstance(network, (PrivateNetwork, PublicNetwork)):
        raise errors.NetworkNotChosen()
    if isinstance(network, PublicNetwork) and public_forbidden(environ):
        raise errors.PublicNetworkForbidden(
            f"anon was not started: the public Anyone network is forbidden here "
            f"({FORBID_PUBLIC_ENV} is set)"
        )
    return network


def check_anonrc(text: str, environ: Mapping[str, str] | None = None) -> None:
    """Last check before a process starts: where public is forbidden, the file must be private."""
    if not public_forbidden(environ):
        return
    keys = {ln.split(None, 1)[0].lower() for ln in text.splitlines() if ln.strip()}
    if not {"testingtornetwork", "dirauthority", "outboundbindaddress"} <= keys or (
        "TestingTorNetwork 1" not in text
    ):
        raise errors.PublicNetworkForbidden(
            "anon was not started: its configuration is not a private network and "
            f"{FORBID_PUBLIC_ENV} is set"
        )
