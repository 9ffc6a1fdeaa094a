"""Hidden services and their client authorization (x25519 keys, Tor's file formats).

Service side: `<hs_dir>/authorized_clients/NAME.auth` holds
`descriptor:x25519:<base32 public key>`; only clients holding the matching private key
can read the service's descriptor, so nobody else can even find it.
Client side: a key file `<service id>:descriptor:x25519:<base32 private key>` (anon's
ClientOnionAuthDir format), mode 0600.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from comfyveil import redaction
from comfyveil.anyone import errors

SERVICE_ID = re.compile(r"^[a-z2-7]{56}$")
CLIENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
KNOWN_SUFFIXES = (".anon", ".anyone")


@dataclass(frozen=True)
class HiddenServiceSpec:
    """A persistent hidden service: its directory (keys, hostname) and what it forwards to."""

    directory: Path
    target: str  # "127.0.0.1:8188"
    port: int = 80
    pow_defense: bool = False  # HiddenServicePoWDefensesEnabled (only if anon has the module)


@dataclass(frozen=True)
class ClientKey:
    service_id: str  # 56 characters, no suffix
    private_key: bytes = b""  # 32 bytes of x25519 private key

    def __repr__(self) -> str:  # never show the key
        return f"ClientKey(service_id={self.service_id!r})"


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw).decode().rstrip("=")


def _unb32(text: str) -> bytes:
    text = text.strip().upper()
    return base64.b32decode(text + "=" * (-len(text) % 8))


def generate_keypair() -> tuple[bytes, bytes]:
    """A fresh x25519 (private, public) key pair, raw 32 bytes each."""
    private = x25519.X25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    priv = private.private_bytes(raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())
    pub = private.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
    return priv, pub


def public_key_b32(public_key: bytes) -> str:
    """The form ADD_ONION's ClientAuthV3= and the .auth files take."""
    return _b32(public_key)


def split_address(address: str) -> tuple[str, str]:
    """('<56 chars>', '.anon') from 'xyz....anon' (a URL host, any case)."""
    host = address.strip().lower().rstrip(".")
    service_id, dot, suffix = host.rpartition(".")
    if not dot or not SERVICE_ID.match(service_id):
        raise errors.HiddenServiceError(f"{address!r} is not a hidden-service address")
    return service_id, "." + suffix


def read_address(hs_dir: Path) -> str:
    """The service's address from anon's `hostname` file, e.g. 'abc...xyz.anon'."""
    try:
        return (hs_dir / "hostname").read_text().strip().lower()
    except OSError as exc:
        raise errors.HiddenServiceError(f"no hidden-service hostname in {hs_dir} yet") from exc


def _check_name(name: str) -> None:
    if not CLIENT_NAME.match(name):
        raise errors.HiddenServiceError(
            f"client name {name!r} may only hold letters, digits, '-' and '_'"
        )


def prepare_dir(hs_dir: Path) -> None:
    """anon insists that a HiddenServiceDir is private to its owner."""
    hs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    hs_dir.chmod(0o700)
    (hs_dir / "authorized_clients").mkdir(exist_ok=True, mode=0o700)
    (hs_dir / "authorized_clients").chmod(0o700)


def add_client(hs_dir: Path, name: str) -> bytes:
    """Authorize a new client NAME; returns its private key (hand it over once)."""
    _check_name(name)
    prepare_dir(hs_dir)
    private, public = generate_keypair()
    path = hs_dir / "authorized_clients" / f"{name}.auth"
    path.write_text(f"descriptor:x25519:{public_key_b32(public)}\n")
    path.chmod(0o600)
    return private


def revoke_client(hs_dir: Path, name: str) -> bool:
    """Remove client NAME; True if it was authorized."""
    _check_name(name)
    path = hs_dir / "authorized_clients" / f"{name}.auth"
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def client_names(hs_dir: Path) -> list[str]:
    folder = hs_dir / "authorized_clients"
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.auth"))


def write_client_key_file(path: Path, service_id: str, private_key: bytes) -> None:
    """Write the bot host's key file, readable by its owner only."""
    if not SERVICE_ID.match(service_id):
        raise errors.HiddenServiceError("not a hidden-service id")
    redaction.register(_b32(private_key))
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{service_id}:descriptor:x25519:{_b32(private_key)}\n")
    path.chmod(0o600)


def read_client_key_file(path: Path) -> ClientKey:
    """Parse a client key file; refuse one that others can read."""
    try:
        if path.stat().st_mode & 0o077:
            raise errors.HiddenServiceError(
                f"key file {path} is readable by others; run: chmod 600 {path}"
            )
        text = path.read_text().strip()
    except OSError as exc:
        raise errors.HiddenServiceError(f"cannot read key file {path}") from exc
    parts = text.split(":")
    if len(parts) == 4:
        redaction.register(parts[3].strip())  # the private key: never in a log line
    if len(parts) != 4 or parts[1:3] != ["descriptor", "x25519"]:
        raise errors.HiddenServiceError(f"{path} is not a hidden-service client key file")
    service_id = parts[0].lower()
    for suffix in KNOWN_SUFFIXES:
        service_id = service_id.removesuffix(suffix)
    try:
        key = _unb32(parts[3])
    except ValueError:
        key = b""
    if not SERVICE_ID.match(service_id) or len(key) != 32:
        raise errors.HiddenServiceError(f"{path} is not a hidden-service client key file")
    return ClientKey(service_id, key)
