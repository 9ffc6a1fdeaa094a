"""Secrets of the settings: read only from the environment, a systemd credential or a
file whose permissions allow nobody else to read it, and a database password refused in a
settings file other users can read."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comfyveil.errors import ConfigError


def read_secret_file(path: Path, what: str) -> str:
    """Read a secret from a file that only its owner may read."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what} file {path} is readable by others; run: chmod 600 {path}")
    return path.read_text().strip()


def credential(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """A systemd credential (`LoadCredential=NAME:FILE` in the unit), else None.

    systemd puts it in $CREDENTIALS_DIRECTORY, readable by the service alone and never in
    its environment (which other processes of the user could read in /proc).
    """
    env = os.environ if environ is None else environ
    directory = env.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / name
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the {name} credential: {exc.strerror}") from exc


def has_password(url: str) -> bool:
    """Whether a PostgreSQL connection string (URL or key=value) holds a password."""
    import psycopg.conninfo  # here: the settings load in commands that never connect

    try:
        return bool(psycopg.conninfo.conninfo_to_dict(url).get("password"))
    except psycopg.ProgrammingError:
        return "password" in url.lower() or "@" in url  # unparsable: assume the worst


def check_password_closed(path: Path, raw: Mapping[str, Any]) -> None:
    """Refuse a database password in a settings file other users can read (as a token
    file with group or other bits is refused).

    Raises:
        ConfigError: what to do instead, in one sentence.
    """
    table = raw.get("database")
    url = table.get("url") if isinstance(table, Mapping) else None
    if not isinstance(url, str) or not has_password(url):
        return
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"config file {path} holds a database password and other users can read it: "
            f"run chmod 600 {path}, or move the URL to [database] url_file (a file only "
            "you can read) or to the systemd credential database-url (LoadCredential=)"
        )
