"""Which backend traffic goes through anon, and on which circuit.

A backend whose host ends with a hidden-service suffix, or one configured with
via = "anyone", goes through anon's SOCKS port; any other via = "direct" or "auto"
backend never does. A hidden-service name never reaches the system's resolver: when the
running anon cannot serve its suffix (a `.anyone` address while anon 0.4.9 serves
`.anon`), or the backend says via = "direct", it is refused with a plain message. Each
backend gets its own circuits (SOCKS username/password isolation). The URL scheme is
socks5h://: the hostname goes to anon and is never resolved locally.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from comfyveil import config
from comfyveil.anyone import daemon, errors, process

# Every suffix a hidden-service address may have: anon's (.anon up to 0.4.9, .anyone
# from 0.4.10) and Tor's, which an operator's Tor daemon serves.
HIDDEN_SUFFIXES = (*process.hidden.KNOWN_SUFFIXES, ".onion")


def hidden_suffix(host: str) -> str | None:
    """The hidden-service suffix `host` ends with ('.anon'), or None."""
    host = host.lower().rstrip(".")
    return next((s for s in HIDDEN_SUFFIXES if host.endswith(s)), None)


def is_hidden_host(host: str, suffixes: tuple[str, ...] = HIDDEN_SUFFIXES) -> bool:
    host = host.lower().rstrip(".")
    return any(host.endswith(suffix) for suffix in suffixes)


def proxy_url_for(
    backend: config.BackendConfig, anon: daemon.AnonClient | None
) -> str | None:
    """The SOCKS proxy URL for this backend, or None to connect directly.

    Raises:
        ConfigError: a hidden-service address with via = "direct".
        AnonError: the backend needs anon but none runs, or the running anon cannot
            serve the address's suffix.
    """
    suffix = hidden_suffix(urlsplit(backend.url).hostname or "")
    if suffix is not None and backend.via == "direct":
        raise config.ConfigError(
            f'backend {backend.name}: its {suffix} address is a hidden service, reached '
            f'only through the Anyone network; remove via = "direct"'
        )
    if suffix is None and backend.via != "anyone":
        return None
    if anon is None:
        raise errors.AnonError(
            f"backend {backend.name} is reached through the Anyone network, "
            "but the Anyone client is not running"
        )
    if suffix is not None and not anon.serves(suffix):
        version = f" {anon.version}" if anon.version else ""
        raise errors.AnonError(
            f"backend {backend.name} has a {suffix} address, but the running anon{version} "
            f"serves {anon.suffix} addresses only: use the backend's {anon.suffix} address "
            f"or an anon release that serves {suffix}"
        )
    return anon.socks_url(f"backend-{backend.name}")


def telegram_proxy_url(
    settings: config.Settings, anon: daemon.AnonClient | None
) -> str | None:
    """The proxy for python-telegram-bot's proxy setting when [anyone] telegram is on."""
    if not settings.anyone.telegram:
        return None
    if anon is None:
        raise errors.AnonError(
            "[anyone] telegram is on, but the Anyone client is not running"
        )
    return anon.socks_url("telegram")
