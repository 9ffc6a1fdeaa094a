"""Publishing the web front end as a hidden service with the managed anon.

`[web] hidden_service = true`: the anon that `comfyveil run` (or `comfyveil web`)
manages publishes the web port, with its key kept in `DATA_DIR/anon/hs/web` so the
address stays the same across restarts, as `comfyveil anon expose --name web` does.
`[web] client_auth = ["alice", ...]` restricts it to those clients: each gets a key file
in `DATA_DIR/anon/client-keys/web-NAME.auth_private` (written once, when the client is
first named), and a client no longer named is revoked. The onion-service proof-of-work
defence is turned on when the anon binary was built with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from comfyveil import config
from comfyveil.anyone import errors as anyone_errors
from comfyveil.anyone import hidden, install
from comfyveil.desk.links import SERVICE_NAME

logger = logging.getLogger(__name__)

VERSION_TIMEOUT = 10.0


@dataclass
class Prepared:
    spec: hidden.HiddenServiceSpec
    new_keys: dict[str, bytes] = field(default_factory=dict)  # client name -> private key
    revoked: list[str] = field(default_factory=list)
    key_dir: Path = Path()


def pow_supported(binary: Path) -> bool:
    """Whether this anon was built with the onion-service proof-of-work module."""
    try:
        out = subprocess.run(
            [str(binary), "--list-modules"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.strip() == "pow: yes" for line in out.splitlines())


def prepare(settings: config.Settings) -> Prepared:
    """The service's directory and clients, before anon starts (blocking file work).

    Raises:
        ConfigError: no fixed port to publish, or a client name anon cannot use.
    """
    w = settings.web
    if w.port == 0:
        raise config.ConfigError("[web] hidden_service needs a fixed [web] port, not 0")
    for name in w.client_auth:
        if not hidden.CLIENT_NAME.match(name):
            raise config.ConfigError(
                f"[web] client_auth name {name!r} may only hold letters, digits, '-' and '_'"
            )
    base = settings.data_dir / "anon"
    host = "127.0.0.1" if w.host in ("0.0.0.0", "::", "") else w.host
    try:
        binary = install.find_binary(settings)
    except anyone_errors.AnonError:
        binary = None
    spec = hidden.HiddenServiceSpec(
        base / "hs" / SERVICE_NAME,
        f"{host}:{w.port}",
        80,
        pow_defense=binary is not None and pow_supported(binary),
    )
    hidden.prepare_dir(spec.directory)
    wanted = set(w.client_auth)
    revoked = [n for n in hidden.client_names(spec.directory) if n not in wanted]
    for name in revoked:
        hidden.revoke_client(spec.directory, name)
    existing = set(hidden.client_names(spec.directory))
    new_keys = {n: hidden.add_client(spec.directory, n) for n in w.client_auth if n not in existing}
    return Prepared(spec=spec, new_keys=new_keys, revoked=revoked, key_dir=base / "client-keys")


async def announce(prepared: Prepared, anon: object, stack: contextlib.AsyncExitStack) -> str:
    """After anon started: write new clients' key files, print the address; returns it.
    Publication is awaited in the background and reported when done."""
    address = await asyncio.to_thread(hidden.read_address, prepared.spec.directory)
    service_id, _ = hidden.split_address(address)
    for name in prepared.revoked:
        print(f"comfyveil: web client {name} revoked", flush=True)
    for name, key in prepared.new_keys.items():
        key_file = prepared.key_dir / f"{SERVICE_NAME}-{name}.auth_private"
        await asyncio.to_thread(hidden.write_client_key_file, key_file, service_id, key)
        print(
            f"comfyveil: web client {name}: key file {key_file} (give it to {name}; mode 0600)",
            flush=True,
        )
    if prepared.spec.pow_defense:
        print("comfyveil: the hidden service's proof-of-work defence is on", flush=True)
    wait_published = getattr(anon, "wait_published", None)
    if wait_published is not None:

        async def report() -> None:
            try:
                await wait_published(service_id)
            except anyone_errors.AnonError as exc:
                print(f"comfyveil: the web hidden service: {exc}", flush=True)
            else:
                print("comfyveil: the web hidden service is published", flush=True)

        task = asyncio.create_task(report(), name="web-hidden-published")
        stack.callback(task.cancel)
    return address
