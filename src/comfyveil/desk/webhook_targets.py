"""Which webhook endpoints an account may register, for every place one is registered
(the settings page, `comfyveil web webhook`) and again before each delivery (a name may
point elsewhere by then): http or https, and not on loopback or private ranges unless
the operator allows them (``[api] webhook_private_targets``), so a key's owner cannot
make the server call into the network it sits in."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from comfyveil import errors
from comfyveil.i18n import _

MAX_URL = 2000
LOCAL_NAMES = ("localhost", ".localhost", ".local", ".internal", ".lan", ".home.arpa")


class TargetRefused(errors.UsageError):
    """That webhook address cannot be used."""


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def parse(url: str) -> tuple[str, int]:
    """The host and port of a webhook URL.

    Raises:
        TargetRefused: not an http(s) URL with a host, or too long.
    """
    parts = urlsplit(url.strip())
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = -1
    if (
        len(url) > MAX_URL
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or port <= 0
    ):
        raise TargetRefused(_("A webhook address is an http:// or https:// URL with a host."))
    return parts.hostname, port


async def check(url: str, *, private_ok: bool, resolve: bool = True) -> None:
    """Refuse a URL this server may not call.

    Args:
        private_ok: ``[api] webhook_private_targets``.
        resolve: look the name up here (False when deliveries leave through anon: the
            exit resolves it, and only a literal address or a local name is known here).

    Raises:
        TargetRefused: one plain sentence.
    """
    host, port = parse(url)
    if private_ok:
        return
    refused = TargetRefused(
        _("Webhooks to loopback or private addresses are off on this server; use a public address.")
    )
    if host.lower().endswith(LOCAL_NAMES) or host.lower() == "localhost":
        raise refused
    try:
        addresses = [host] if ipaddress.ip_address(host) else []
    except ValueError:
        addresses = []
        if resolve:
            try:
                found = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
            except OSError:
                raise TargetRefused(
                    _("The webhook address {host} could not be found.").format(host=host[:80])
                ) from None
            addresses = [str(info[4][0]) for info in found]
    if any(not _public(a) for a in addresses):
        raise refused
