"""Real anon on a private network on 127.0.0.1: hidden services, client auth, restarts."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import hashlib
import os
import pwd
import re
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import telegram
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from comfyveil import config, config_load
from comfyveil.anyone import errors, hidden, routing, runtime
from comfyveil.cli import anon as anon_cli
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import pool
from comfyveil.telegram.request import AiohttpRequest
from tests.anyone import helpers
from tests.fakes.telegram import FakeTelegram
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

    # Without the key the service cannot even be found, and anon says why.
    await helpers.unreachable(proxy, url, because=0xF4)

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
    # At every directory: one not reached yet still serves the old descriptor, which our
    # key opens, to introduction points that are gone (most likely why the first attempt
    # failed without a hidden-service reason in one soak run of 15).
    await host.wait_published(service_id, after=uploads, everywhere=True)
    await client.new_identity()  # forget the cached descriptor and circuits
    await helpers.unreachable(proxy, url, because=0xF5)  # our key no longer opens it


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
    # The same proxy URL keeps working: the restarted anon listens on the same socket.
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
        await helpers.unreachable(proxy, f"http://{address}/hello", because=0xF4, attempts=1)
        await anon_pair.client.add_client_key(key_file)
        reply = await helpers.get_json(proxy, f"http://{address}/hello", anon=anon_pair.client)
        assert reply["backend"] == "gpu-open"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- the managed anon's ports: Unix sockets only this user can open ----------------------


def _listening_tcp_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = str(fd.readlink())
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _connect_as_nobody(path: Path) -> int:
    """The errno of connect() to the Unix socket `path` by user nobody (0: connected).

    A forked child switches user and only makes system calls before it exits."""
    nobody = pwd.getpwnam("nobody")
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
        except OSError as exc:
            code = exc.errno or 255
        except BaseException:
            code = 254
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@contextlib.contextmanager
def _traversable_up_to(folder: Path) -> Iterator[None]:
    """Let other users pass through folder's ancestors (pytest makes its base 0700), so
    that only the state directory's own mode stands between them and anon's sockets."""
    changed = []
    for parent in reversed(folder.parents):
        mode = stat.S_IMODE(parent.stat().st_mode)
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)
            changed.append((parent, mode))
    try:
        yield
    finally:
        for parent, mode in reversed(changed):
            parent.chmod(mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
async def test_managed_anon_listens_only_on_private_unix_sockets(
    anon_pair: AnonPair, tmp_path: Path,
) -> None:
    client = anon_pair.client
    assert client.pid is not None and client.socks_path is not None
    state = client.data_dir
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for path in (client.socks_path, client.control_path):
        assert path.parent == state and stat.S_ISSOCK(path.stat().st_mode), path
    # No TCP port at all: nothing another user could connect to, or take first while
    # anon restarts.
    assert not _socket_inodes(client.pid) & _listening_tcp_inodes()

    # Traffic flows through the Unix socket: the proxy URL names it, and it works.
    address = anon_pair.gpu_host.address_of(anon_pair.open_service)
    proxy = _proxy(anon_pair, "open", address)
    assert proxy.endswith(f"@localhost{client.socks_path}")
    reply = await helpers.get_json(proxy, f"http://{address}/hello", anon=client)
    assert reply["backend"] == "gpu-open"

    # Another user cannot open either socket; the same user can, and so can nobody
    # open a socket in a directory that is not private (the test's own control).
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    control_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control_socket.bind(str(open_dir / "s.sock"))
    (open_dir / "s.sock").chmod(0o777)
    control_socket.listen()
    try:
        with _traversable_up_to(state), _traversable_up_to(open_dir):
            assert _connect_as_nobody(open_dir / "s.sock") == 0
            assert _connect_as_nobody(client.socks_path) == errno.EACCES
            assert _connect_as_nobody(client.control_path) == errno.EACCES
    finally:
        control_socket.close()


def _checksum(suffix: str, key: bytes, version: bytes) -> bytes:
    # Tor's rend-spec-v3 checksum, with anon's suffix where Tor has ".onion".
    return hashlib.sha3_256(f"{suffix} checksum".encode() + key + version).digest()[:2]


def _unpublished_service_id(suffix: str) -> str:
    """A well-formed address that nobody publishes."""
    key = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b32encode(key + _checksum(suffix, key, b"\x03") + b"\x03").decode().lower()


async def test_the_address_encoding_is_anons(anon_pair: AnonPair) -> None:
    service_id, suffix = hidden.split_address(
        anon_pair.gpu_host.address_of(anon_pair.open_service))
    raw = base64.b32decode(service_id.upper())
    key, checksum, version = raw[:32], raw[32:34], raw[34:]
    assert _checksum(suffix, key, version) == checksum


async def test_refusals_of_hidden_backends_say_why(
    anon_pair: AnonPair, hidden_backend: HiddenBackend,
) -> None:
    """anon's extended SOCKS errors reach the user as the backend's error."""
    client = anon_pair.client
    # A service with client authorization for a key this client was never given.
    _, public = hidden.generate_keypair()
    private = await anon_pair.gpu_host.add_ephemeral(
        hidden_backend.target, client_auth_v3=[hidden.public_key_b32(public)])
    service_id, suffix = hidden.split_address(private)
    unpublished = _unpublished_service_id(suffix) + suffix
    broken = ("b" if service_id[0] != "b" else "c") + service_id[1:] + suffix  # bad checksum
    cases = {
        "cloud": (private, "backend cloud needs a client key (auth_key_file)"),
        "gone": (unpublished, "backend gone is not published"),
        "typo": (broken, "backend typo has an invalid hidden-service address"),
    }
    try:
        for name, (address, words) in cases.items():
            backend = config.BackendConfig(name, f"http://{address}")
            async with comfy_client.ComfyClient(
                backend.url, name=name, proxy=routing.proxy_url_for(backend, client),
                timeout=60,
            ) as comfy:
                with pytest.raises(comfy_errors.BackendUnreachable) as http:
                    await comfy.system_stats()
            assert str(http.value).startswith(words), (name, str(http.value))
    finally:
        await anon_pair.gpu_host.remove_ephemeral(private)


async def test_a_suffix_anon_does_not_serve_is_refused_never_resolved(
    anon_pair: AnonPair, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """anon 0.4.9 serves .anon: a .anyone backend (or the other way round with 0.4.10) is
    refused in words when the pool starts, and its name is never looked up."""
    client = anon_pair.client
    assert client.suffix in (".anon", ".anyone")
    other = ".anyone" if client.suffix == ".anon" else ".anon"
    service_id, _ = hidden.split_address(anon_pair.gpu_host.address_of(anon_pair.open_service))
    lookups: list[object] = []
    real_getaddrinfo = socket.getaddrinfo

    def recording_getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        lookups.append(host)
        return real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", recording_getaddrinfo)
    backend = config.BackendConfig("cloud", f"http://{service_id}{other}")
    router = runtime.Router(client, config_load.from_mapping({}, environ={}))
    with pytest.raises(errors.AnonError, match=(
            rf"backend cloud has a \{other} address, but the running anon "
            rf"{re.escape(client.version or '')} serves \{client.suffix} addresses only")):
        async with pool.Pool([backend], proxy_for=router.proxy_for, probe_interval=60):
            pass
    assert not [h for h in lookups if str(h).endswith(other)]


async def test_bot_api_requests_go_through_anons_unix_socket(
    anon_pair: AnonPair, fake_telegram: FakeTelegram,
) -> None:
    """[anyone] telegram: PTB's requests reach the Bot API through anon (an exit that may
    connect to 127.0.0.1), dialled over the Unix socket."""
    settings = config_load.from_mapping({"anyone": {"telegram": True}}, environ={})
    proxy = routing.telegram_proxy_url(settings, anon_pair.client)
    assert proxy is not None and proxy.endswith(f"@localhost{anon_pair.client.socks_path}")
    deadline = asyncio.get_running_loop().time() + 90
    while True:
        bot = telegram.Bot(fake_telegram.token, base_url=fake_telegram.base_url,
                           request=AiohttpRequest(proxy=proxy, read_timeout=30,
                                                  connect_timeout=30))
        try:
            async with bot:  # getMe
                me = await bot.get_me()
            break
        except telegram.error.NetworkError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await anon_pair.client.new_identity()
            await asyncio.sleep(1)
    assert me.username == fake_telegram.bot_user["username"]
