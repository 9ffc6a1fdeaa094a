"""Which backend traffic goes through anon, and on which circuit.

A backend whose host ends with the daemon's hidden-service suffix, or one configured
with via = "anyone", goes through anon's SOCKS port; via = "direct" never does. Each
backend gets its own circuits (SOCKS username/password isolation). The URL scheme is
socks5h://: httpx and websockets then hand the hostname to anon and never resolve it
locally (websockets resolves locally for plain socks5://).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from comfyveil import config
from comfyveil.anyone import errors, process


def is_hidden_host(host: str, suffixes: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    return any(host.endswith(suffix) for suffix in suffixes)


def proxy_url_for(
    backend: config.BackendConfig, anon: process.AnonClient | None
) -> str | None:
    """The SOCKS proxy URL for this backend, or None to connect directly."""
    if backend.via == "direct":
        return None
    host = urlsplit(backend.url).hostname or ""
    suffixes = anon.hidden_suffixes if anon is not None else ()
    needs_anon = backend.via == "anyone" or is_hidden_host(
        host, suffixes or process.hidden.KNOWN_SUFFIXES
    )
    if not needs_anon:
        return None
    if anon is None:
        raise errors.AnonError(
            f"backend {backend.name} is reached through the Anyone network, "
            "but the Anyone client is not running"
        )
    return anon.socks_url(f"backend-{backend.name}")


def telegram_proxy_url(
    settings: config.Settings, anon: process.AnonClient | None
) -> str | None:
    """The proxy for python-telegram-bot's proxy setting when [anyone] telegram is on."""
    if not settings.anyone.telegram:
        return None
    if anon is None:
        raise errors.AnonError(
            "[anyone] telegram is on, but the Anyone client is not running"
        )
    return anon.socks_url("telegram")
