"""Real anon on a private network on 127.0.0.1: hidden services, client auth, restarts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest

from comfyveil import config
from comfyveil.anyone import hidden, routing
from comfyveil.cli import anon as anon_cli
from tests.anyone import helpers
from tests.fixtures.anyone import AnonPair, HiddenBackend, PrivateAnyoneNetwork

pytestmark = [pytest.mark.anyone, pytest.mark.slow]


def _proxy(pair: AnonPair, name: str, address: str) -> str:
    backend = config.BackendConfig(name, f"http://{address}")
    proxy = routing.proxy_url_for(backend, pair.client)
    assert proxy is not None, "a hidden-service backend must go through anon"
    return proxy


async def test_http_and_websocket_through_a_hidden_service(
    anon_pair: AnonPair, hidden_backend: HiddenBackend
) -> None:
    address = await anon_pair.gpu_host.add_ephemeral(hidden_backend.target)
    try:
        assert address.endswith(anon_pair.client.suffix or "?")
        proxy = _proxy(anon_pair, "gpu0", address)
        reply = await helpers.get_json(proxy, f"http://{address}/hello", anon=anon_pair.client)
        assert reply == {"backend": "gpu-open", "host": address}
        assert await helpers.ws_echo(proxy, f"ws://{address}/ws", "ping") == "gpu-open:ping"
    finally:
        await anon_pair.gpu_host.remove_ephemeral(address)


async def test_client_authorization(anon_pair: AnonPair, tmp_path: Path) -> None:
    host, client = anon_pair.gpu_host, anon_pair.client
    address = host.address_of(anon_pair.private_service)
    service_id, _ = hidden.split_address(address)
    await host.wait_published(service_id)
    url = f"http://{address}/hello"
    proxy = _proxy(anon_pair, "private", address)

    # Without the key the service cannot even be found.
    assert await helpers.unreachable(proxy, url), "reachable without the client key"

    # The bot host's configuration: the key file `expose` writes, nothing else.
    key_file = tmp_path / "bot.auth_private"
    hidden.write_client_key_file(key_file, service_id, anon_pair.bot_private_key)
    await client.add_client_key(key_file)
    await client.new_identity()
    reply = await helpers.get_json(proxy, url, anon=client)
    assert reply["backend"] == "gpu-private"

    # Revoked: the service comes back with new introduction points and a descriptor
    # encrypted only for its remaining clients.
    uploads = host.upload_count(service_id)
    assert await host.revoke_client(anon_pair.private_service, "bot")
    assert host.address_of(anon_pair.private_service) == address
    await host.wait_published(service_id, after=uploads)
    await client.new_identity()  # forget the cached descriptor and circuits
    assert await helpers.unreachable(proxy, url), "a revoked client still reaches the service"


async def test_address_persists_across_restart(
    anon_pair: AnonPair, hidden_backend: HiddenBackend
) -> None:
    host = anon_pair.gpu_host
    before = host.address_of(anon_pair.open_service)
    service_id, _ = hidden.split_address(before)
    uploads = host.upload_count(service_id)
    await host.restart()
    after = host.address_of(anon_pair.open_service)
    assert after == before
    await host.wait_published(service_id, after=uploads)
    await anon_pair.client.new_identity()
    reply = await helpers.get_json(_proxy(anon_pair, "open", after), f"http://{after}/hello",
                                   anon=anon_pair.client, within=150)
    assert reply["backend"] == "gpu-open"


async def test_killed_anon_is_restarted(anon_pair: AnonPair) -> None:
    client = anon_pair.client
    address = anon_pair.gpu_host.address_of(anon_pair.open_service)
    proxy = _proxy(anon_pair, "open", address)
    await helpers.get_json(proxy, f"http://{address}/hello", anon=client)
    old_pid, restarts = client.pid, client.restarts
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    for _ in range(600):
        if client.restarts != restarts:
            break
        await asyncio.sleep(0.2)
    await client.wait_ready(60)
    assert client.pid not in (None, old_pid)
    # The same proxy URL keeps working: the restarted anon reuses its ports.
    assert _proxy(anon_pair, "open", address) == proxy
    reply = await helpers.get_json(proxy, f"http://{address}/hello", anon=client)
    assert reply["backend"] == "gpu-open"


async def test_expose_command_publishes_with_client_authorization(
    anon_pair: AnonPair, anyone_network: PrivateAnyoneNetwork, hidden_backend: HiddenBackend,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The operator's flow: `anon expose --client bot` on the GPU host, the key on the bot."""
    assert anyone_network.network is not None
    net_file = tmp_path / "private-network"
    net_file.write_text(anyone_network.network.to_file_text())
    monkeypatch.setenv("ANON_BINARY", str(anyone_network.binary))
    args = anon_cli.argparse.Namespace(
        target=hidden_backend.target, name="comfyui", port=80, client=["bot"], revoke=[],
        no_auth=False, private_network=net_file, once=False, config=None)
    task = asyncio.create_task(anon_cli._expose(args))
    out = ""
    try:
        for _ in range(900):
            out += capsys.readouterr().out
            if "published" in out or task.done():
                break
            await asyncio.sleep(0.2)
        assert not task.done(), task.exception() if task.done() else None
        address = out.split("address: ", 1)[1].split()[0]
        key_file = Path(out.split("key file ", 1)[1].split()[0])
        assert (key_file.stat().st_mode & 0o777) == 0o600
        assert f'url = "http://{address}"' in out
        proxy = _proxy(anon_pair, "exposed", address)
        assert await helpers.unreachable(proxy, f"http://{address}/hello", attempts=1)
        await anon_pair.client.add_client_key(key_file)
        reply = await helpers.get_json(proxy, f"http://{address}/hello", anon=anon_pair.client)
        assert reply["backend"] == "gpu-open"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
