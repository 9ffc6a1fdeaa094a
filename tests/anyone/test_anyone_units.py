"""The Anyone layer without a network: safety refusals, install checks, keys, routing."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import shutil
import stat
import struct
import tarfile
from pathlib import Path

import pytest
import telegram

from comfyveil import config, config_load, redaction
from comfyveil.anyone import control, daemon, errors, hidden, install, process, routing
from comfyveil.anyone import network as network_mod
from comfyveil.cli import anon as anon_cli
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import errors as comfy_errors
from comfyveil.telegram.request import AiohttpRequest

AUTH = ("auth0 orport=5000 no-v2 v3ident=" + "A" * 40 + " 127.0.0.1:5001 " + "B" * 40,)
SERVICE_ID = "a" * 56


def _fake_anon(tmp_path: Path) -> Path:
    """A stand-in 'anon' that records that it was started."""
    binary = tmp_path / "bin" / "anon"
    binary.parent.mkdir()
    binary.write_text(f"#!/bin/sh\necho started > {tmp_path / 'was-started'}\nsleep 5\n")
    binary.chmod(0o755)
    return binary


# -- the process manager refuses to start anon without an explicit, allowed network ----


async def test_manager_refuses_to_start_without_a_network(tmp_path: Path) -> None:
    binary = _fake_anon(tmp_path)
    with pytest.raises(errors.NetworkNotChosen, match="say which network"):
        process.ManagedAnon(network=None, binary=binary, data_dir=tmp_path / "state")
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "was-started").exists()


async def test_manager_refuses_public_network_when_forbidden(tmp_path: Path) -> None:
    binary = _fake_anon(tmp_path)
    assert os.environ[network_mod.FORBID_PUBLIC_ENV] == "1"  # set for the whole session
    with pytest.raises(errors.PublicNetworkForbidden, match="forbidden"):
        process.ManagedAnon(network=network_mod.PublicNetwork(), binary=binary,
                            data_dir=tmp_path / "state")
    # Allowed when built, forbidden by the time it starts: still refused, nothing runs.
    allowed = process.ManagedAnon(network=network_mod.PublicNetwork(), binary=binary,
                                  data_dir=tmp_path / "state", environ={})
    allowed._environ = {network_mod.FORBID_PUBLIC_ENV: "1"}
    with pytest.raises(errors.PublicNetworkForbidden):
        await allowed.start()
    assert not (tmp_path / "was-started").exists()


def test_private_network_must_name_loopback_authorities() -> None:
    with pytest.raises(errors.NetworkNotChosen):
        network_mod.PrivateNetwork(())
    with pytest.raises(errors.NetworkNotChosen, match=r"127\.0\.0\.1"):
        network_mod.PrivateNetwork((AUTH[0].replace("127.0.0.1", "203.0.113.7"),))
    with pytest.raises(errors.NetworkNotChosen, match="cannot be overridden"):
        network_mod.PrivateNetwork(AUTH, extra=("OutboundBindAddress 0.0.0.0",))
    lines = network_mod.PrivateNetwork(AUTH).anonrc_lines()
    for required in ("TestingTorNetwork 1", "UseDefaultFallbackDirs 0",
                     "OutboundBindAddress 127.0.0.1", f"DirAuthority {AUTH[0]}"):
        assert required in lines


def test_written_anonrc_is_private(tmp_path: Path, short_tmp_path: Path) -> None:
    state = short_tmp_path / "state"
    anon = process.ManagedAnon(network=network_mod.PrivateNetwork(AUTH),
                               binary=_fake_anon(tmp_path), data_dir=state)
    text = anon._anonrc()
    network_mod.check_anonrc(text)  # passes
    # Unix sockets in the private state directory, never a TCP port: no flag that
    # would let anon accept a group- or world-accessible directory.
    assert f'SocksPort unix:"{state / "socks.sock"}" ExtendedErrors' in text.splitlines()
    assert f'ControlPort unix:"{state / "control.sock"}"' in text.splitlines()
    assert "127.0.0.1:" not in text.replace("127.0.0.1:5001", "") and "9050" not in text
    for flag in ("GroupWritable", "WorldWritable", "RelaxDirModeCheck"):
        assert flag not in text
    with pytest.raises(errors.PublicNetworkForbidden):
        network_mod.check_anonrc("AgreeToTerms 1\nSocksPort 9050\n")


async def test_a_deep_state_directory_gets_private_sockets_elsewhere(tmp_path: Path) -> None:
    """A socket path holds about 100 bytes: a deeper state directory gets its sockets in
    a private folder of the temporary directory, removed when anon is closed."""
    deep = tmp_path / ("d" * 60) / "state"
    anon = process.ManagedAnon(network=network_mod.PrivateNetwork(AUTH),
                               binary=_fake_anon(tmp_path), data_dir=deep)
    assert anon.socks_path is None
    anon._prepare()
    assert anon.socks_path is not None and anon.control_path is not None
    folder = anon.socks_path.parent
    assert folder == anon.control_path.parent and not folder.is_relative_to(tmp_path)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert f'SocksPort unix:"{anon.socks_path}" ExtendedErrors' in (deep / "anonrc").read_text()
    anon._prepare()  # a restart keeps the same sockets
    assert anon.socks_path.parent == folder
    await anon.close()
    assert not folder.exists() and anon.socks_path is None


def test_network_file_round_trip(tmp_path: Path) -> None:
    net = network_mod.PrivateNetwork(AUTH, extra=("TestingV3AuthInitialVotingInterval 10",))
    path = tmp_path / "net"
    path.write_text(net.to_file_text())
    assert network_mod.PrivateNetwork.from_file(path) == net


# -- install -------------------------------------------------------------------------


def test_linux_arm64_is_refused_plainly() -> None:
    with pytest.raises(errors.UnsupportedPlatform, match="no anon binary for linux/arm64"):
        install.platform_dir("Linux", "aarch64")
    assert install.platform_dir("Linux", "x86_64") == "linux/x64"


async def test_install_without_npm_says_what_to_do(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(errors.AnonNotInstalled, match=r"install Node\.js with npm"):
        await install.install(tmp_path / "anon")


async def test_install_refuses_a_tampered_package(tmp_path: Path) -> None:
    """A fake npm hands out a package whose anon is not the pinned one."""
    payload = b"#!/bin/sh\necho evil\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        for name in install.FILES:
            info = tarfile.TarInfo(f"package/bin/linux/x64/{name}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    tgz = tmp_path / "evil.tgz"
    tgz.write_bytes(buf.getvalue())
    npm = tmp_path / "npm"
    npm.write_text(f"#!/bin/sh\ncp {tgz} ./anyone-protocol-anyone-client-1.1.3.tgz\n")
    npm.chmod(0o755)
    with pytest.raises(errors.IntegrityError, match="refusing to install"):
        await install.install(tmp_path / "anon", npm=str(npm))
    assert not (tmp_path / "anon" / "anon").exists()


async def test_install_checks_hashes_of_the_installed_copy(
    tmp_path: Path, anon_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = tmp_path / "anon"
    target.mkdir()
    for name in install.FILES:
        shutil.copy2(anon_dir / name, target / name)
    monkeypatch.setenv("PATH", str(tmp_path / "no-npm-here"))  # a download would fail
    assert await asyncio.to_thread(install.mismatched_files, target) == []
    code = await anon_cli._install(anon_cli.argparse.Namespace(
        dir=target, tarball=None, force=False, config=None))
    assert code == 0
    assert "0.4.9" in capsys.readouterr().out
    with (target / "geoip6").open("ab") as handle:
        handle.write(b"tampered")
    assert install.mismatched_files(target) == ["geoip6"]
    with pytest.raises(errors.AnonNotInstalled):  # it would fetch again, and cannot here
        await install.install(target)


def test_find_binary_reports_missing_install(tmp_path: Path) -> None:
    settings = config_load.from_mapping({"data_dir": str(tmp_path)}, environ={})
    with pytest.raises(errors.AnonNotInstalled, match="comfyveil anon install"):
        install.find_binary(settings, environ={})
    binary = _fake_anon(tmp_path)
    assert install.find_binary(settings, environ={"ANON_BINARY": str(binary)}) == binary


# -- versions, keys ------------------------------------------------------------------


def test_suffix_comes_from_the_version() -> None:
    assert daemon.suffix_for_version("0.4.9.11-live") == ".anon"
    assert daemon.suffix_for_version("0.4.10.1") == ".anyone"
    assert daemon.suffix_for_version("0.5.0.0") == ".anyone"


def test_client_key_files(tmp_path: Path) -> None:
    hs_dir = tmp_path / "hs"
    private = hidden.add_client(hs_dir, "bot")
    auth = (hs_dir / "authorized_clients" / "bot.auth").read_text().strip()
    assert auth.startswith("descriptor:x25519:") and len(auth.split(":")[2]) == 52
    key_file = tmp_path / "keys" / "bot.auth_private"
    hidden.write_client_key_file(key_file, SERVICE_ID, private)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key_file.read_text().startswith(f"{SERVICE_ID}:descriptor:x25519:")
    key = hidden.read_client_key_file(key_file)
    assert key.service_id == SERVICE_ID and key.private_key == private
    assert "x25519" not in repr(key) and private.hex() not in repr(key)
    key_file.chmod(0o644)
    with pytest.raises(errors.HiddenServiceError, match="chmod 600"):
        hidden.read_client_key_file(key_file)
    assert hidden.revoke_client(hs_dir, "bot") and hidden.client_names(hs_dir) == []
    with pytest.raises(errors.HiddenServiceError):
        hidden.add_client(hs_dir, "../escape")


async def test_expose_requires_client_authorization_by_default(tmp_path: Path) -> None:
    args = anon_cli.argparse.Namespace(
        target="127.0.0.1:8188", name="comfyui", port=80, client=[], revoke=[], no_auth=False,
        private_network=None, once=True, config=None)
    with pytest.raises(anon_cli.UsageError, match="--client NAME"):
        await anon_cli._expose(args)


# -- routing -------------------------------------------------------------------------


class _Attached(daemon.AttachedAnon):
    def __init__(self, port: int, suffix: str | None = ".anon") -> None:
        super().__init__(socks=f"127.0.0.1:{port}")
        self.suffix = suffix


def test_routing_rules() -> None:
    anon = _Attached(9999)
    onion = config.BackendConfig("gpu0", f"http://{SERVICE_ID}.anon")
    local = config.BackendConfig("local", "http://127.0.0.1:8188")
    forced = config.BackendConfig("cloud", "http://127.0.0.1:8188", via="anyone")
    direct_ip = config.BackendConfig("lan", "http://10.0.0.5:8188", via="direct")
    url = routing.proxy_url_for(onion, anon)
    assert url is not None and url.startswith("socks5h://comfyveil-backend-gpu0:")
    assert url.endswith("@127.0.0.1:9999")
    assert routing.proxy_url_for(local, anon) is None
    assert routing.proxy_url_for(forced, anon) is not None
    assert routing.proxy_url_for(direct_ip, anon) is None
    # Different backends, different SOCKS credentials: different circuits.
    assert routing.proxy_url_for(forced, anon) != url
    with pytest.raises(errors.AnonError, match="not running"):
        routing.proxy_url_for(onion, None)
    # A newer daemon serves .anyone.
    newer = _Attached(9999, ".anyone")
    assert routing.proxy_url_for(config.BackendConfig("n", f"http://{SERVICE_ID}.anyone"),
                                 newer) is not None


def test_no_hidden_name_ever_goes_to_the_system_resolver() -> None:
    """Each hidden-service suffix goes through anon, or is refused in words: never a
    direct connection (which would resolve the name with the system's DNS)."""
    older, newer = _Attached(9999, ".anon"), _Attached(9999, ".anyone")
    older.version = "0.4.9.11-live"
    anyone = config.BackendConfig("cloud", f"http://{SERVICE_ID}.anyone")
    anon = config.BackendConfig("cloud", f"http://{SERVICE_ID}.ANON.")
    with pytest.raises(errors.AnonError, match=(
            r"backend cloud has a \.anyone address, but the running anon 0\.4\.9\.11-live "
            r"serves \.anon addresses only")):
        routing.proxy_url_for(anyone, older)
    with pytest.raises(errors.AnonError, match=r"has a \.anon address.* \.anyone addresses only"):
        routing.proxy_url_for(anon, newer)
    managed = process.ManagedAnon(network=network_mod.PrivateNetwork(AUTH),
                                  binary=Path("/nonexistent/anon"), data_dir=Path("/tmp/x"))
    managed.suffix = ".anon"
    onion = config.BackendConfig("tor", f"http://{SERVICE_ID}.onion")
    with pytest.raises(errors.AnonError, match=r"has a \.onion address"):
        routing.proxy_url_for(onion, managed)
    # An operator's daemon may be Tor, which serves .onion: its business.
    assert routing.proxy_url_for(onion, older) is not None
    for backend in (anyone, anon, onion):
        direct = config.BackendConfig(backend.name, backend.url, via="direct")
        with pytest.raises(config.ConfigError, match=r'hidden service.*remove via = "direct"'):
            routing.proxy_url_for(direct, older)


def test_telegram_proxy() -> None:
    anon = _Attached(9999)
    on = config_load.from_mapping({"anyone": {"telegram": True}}, environ={})
    off = config_load.from_mapping({}, environ={})
    assert routing.telegram_proxy_url(off, anon) is None
    assert routing.telegram_proxy_url(on, anon) == anon.socks_url("telegram")


class _RecordingSocks:
    """A SOCKS5 server on 127.0.0.1 (or on a Unix socket) that records each CONNECT
    request and refuses it with `reply` (4: host unreachable; 0xF0-0xF7: anon's
    ExtendedErrors codes for hidden services)."""

    def __init__(self, reply: int = 4, unix_path: Path | None = None) -> None:
        self.requests: list[tuple[str, str, int, str]] = []  # (atyp, host, port, user)
        self.server: asyncio.Server | None = None
        self.reply = reply
        self.unix_path = unix_path

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            _, nmethods = await reader.readexactly(2)
            methods = await reader.readexactly(nmethods)
            user = ""
            if 2 in methods:
                writer.write(b"\x05\x02")
                _, ulen = await reader.readexactly(2)
                user = (await reader.readexactly(ulen)).decode()
                (plen,) = await reader.readexactly(1)
                await reader.readexactly(plen)
                writer.write(b"\x01\x00")
            else:
                writer.write(b"\x05\x00")
            _, _, _, atyp = await reader.readexactly(4)
            if atyp == 3:
                (length,) = await reader.readexactly(1)
                host, kind = (await reader.readexactly(length)).decode(), "domain"
            elif atyp == 1:
                host, kind = ".".join(str(b) for b in await reader.readexactly(4)), "ipv4"
            else:
                host, kind = (await reader.readexactly(16)).hex(), "ipv6"
            (port,) = struct.unpack("!H", await reader.readexactly(2))
            self.requests.append((kind, host, port, user))
            writer.write(bytes([5, self.reply, 0, 1]) + bytes(6))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> int:
        if self.unix_path is not None:
            self.server = await asyncio.start_unix_server(self._handle, str(self.unix_path))
            return 0
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server:
            self.server.close()
            await self.server.wait_closed()


async def test_socks_request_carries_the_hostname_not_an_address() -> None:
    """The ComfyUI client (HTTP and WebSocket) and the Bot API requests, given our proxy
    URLs, hand the host name to the proxy and never resolve it here."""
    socks = _RecordingSocks()
    anon = _Attached(await socks.start())
    host = f"{SERVICE_ID}.anon"
    backend = config.BackendConfig("gpu0", f"http://{host}")
    proxy = routing.proxy_url_for(backend, anon)
    assert proxy is not None
    telegram_proxy = anon.socks_url("telegram")
    try:
        async with comfy_client.ComfyClient(backend.url, name="gpu0", proxy=proxy) as client:
            with pytest.raises(comfy_errors.BackendUnreachable):
                await client.system_stats()
            with pytest.raises(comfy_errors.BackendUnreachable):
                await client.run({})  # opens the WebSocket first
        bot = telegram.Bot("1:test", base_url=f"http://api.{host}/bot",
                           request=AiohttpRequest(proxy=telegram_proxy))
        with pytest.raises(telegram.error.NetworkError):
            async with bot:  # getMe
                pass
    finally:
        await socks.stop()
    assert [r[:3] for r in socks.requests] == [
        ("domain", host, 80), ("domain", host, 80), ("domain", f"api.{host}", 80)]
    assert [r[3] for r in socks.requests] == [
        "comfyveil-backend-gpu0", "comfyveil-backend-gpu0", "comfyveil-telegram"]



async def test_every_consumer_dials_a_socks_proxy_on_a_unix_socket(tmp_path: Path) -> None:
    """Our anon's SOCKS port is a Unix socket: the ComfyClient's HTTP and WebSocket and
    the Bot API requests all reach it there, still handing over the host name."""
    socks = _RecordingSocks(unix_path=tmp_path / "socks.sock")
    await socks.start()
    anon = _Attached(0)
    anon.socks_path = tmp_path / "socks.sock"
    host = f"{SERVICE_ID}.anon"
    backend = config.BackendConfig("gpu0", f"http://{host}")
    proxy = routing.proxy_url_for(backend, anon)
    assert proxy is not None and proxy.startswith("socks5h://comfyveil-backend-gpu0:")
    assert proxy.endswith(f"@localhost{tmp_path}/socks.sock")
    try:
        async with comfy_client.ComfyClient(backend.url, name="gpu0", proxy=proxy) as client:
            with pytest.raises(comfy_errors.BackendUnreachable):
                await client.system_stats()
            with pytest.raises(comfy_errors.BackendUnreachable):
                await client.run({})  # opens the WebSocket first
        bot = telegram.Bot("1:test", base_url=f"http://api.{host}/bot",
                           request=AiohttpRequest(proxy=anon.socks_url("telegram")))
        with pytest.raises(telegram.error.NetworkError):
            async with bot:  # getMe
                pass
    finally:
        await socks.stop()
    assert socks.requests == [
        ("domain", host, 80, "comfyveil-backend-gpu0"),
        ("domain", host, 80, "comfyveil-backend-gpu0"),
        ("domain", f"api.{host}", 80, "comfyveil-telegram"),
    ]


async def test_a_missing_unix_socket_is_an_unreachable_backend(tmp_path: Path) -> None:
    anon = _Attached(0)
    anon.socks_path = tmp_path / "gone.sock"
    backend = config.BackendConfig("gpu0", f"http://{SERVICE_ID}.anon")
    proxy = routing.proxy_url_for(backend, anon)
    async with comfy_client.ComfyClient(backend.url, name="gpu0", proxy=proxy) as client:
        with pytest.raises(comfy_errors.BackendUnreachable, match="gpu0 cannot be reached"):
            await client.system_stats()
        with pytest.raises(comfy_errors.BackendUnreachable, match="gpu0 cannot be reached"):
            await client.run({})


@pytest.mark.parametrize(("code", "words"), [
    (0xF0, "gpu0 is not published: its hidden-service descriptor was not found"),
    (0xF4, "gpu0 needs a client key (auth_key_file)"),
    (0xF5, "gpu0 refused our client key (auth_key_file): it is wrong or was revoked"),
    (0xF6, "gpu0 has an invalid hidden-service address"),
    (0xF7, "gpu0 did not answer: the introduction to its hidden service timed out"),
])
async def test_a_refusing_hidden_backend_says_why(tmp_path: Path, code: int, words: str) -> None:
    """anon's ExtendedErrors reply codes become the backend's error, over HTTP and the
    WebSocket alike."""
    socks = _RecordingSocks(reply=code, unix_path=tmp_path / "socks.sock")
    await socks.start()
    anon = _Attached(0)
    anon.socks_path = tmp_path / "socks.sock"
    backend = config.BackendConfig("gpu0", f"http://{SERVICE_ID}.anon")
    try:
        async with comfy_client.ComfyClient(
            backend.url, name="gpu0", proxy=routing.proxy_url_for(backend, anon)
        ) as client:
            with pytest.raises(comfy_errors.BackendUnreachable) as http:
                await client.system_stats()
            with pytest.raises(comfy_errors.BackendUnreachable) as ws:
                await client.run({})
    finally:
        await socks.stop()
    assert str(http.value) == str(ws.value)
    assert str(http.value).startswith(f"backend {words}")


async def test_supervisor_keeps_restarting_after_any_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A restart that fails with something other than an AnonError (a full disk, a
    control connection that hangs up) is retried, not the end of supervision."""
    monkeypatch.setattr(process, "RESTART_BACKOFF", (0.01, 0.05))
    anon = process.ManagedAnon(network=network_mod.PrivateNetwork(AUTH),
                               binary=_fake_anon(tmp_path), data_dir=tmp_path / "state")
    failures = [OSError(28, "No space left on device"), ConnectionResetError("hung up"),
                KeyError("version")]
    launches = 0

    async def launch() -> None:  # stands in for starting anon and waiting for bootstrap
        nonlocal launches
        launches += 1
        if launches > 1 and failures:
            raise failures.pop(0)
        anon._proc = await asyncio.create_subprocess_exec("sleep", "60")
        anon._ready.set()

    monkeypatch.setattr(anon, "_launch", launch)
    await anon.start()
    try:
        first = anon.pid
        assert first is not None
        os.kill(first, 9)
        async with asyncio.timeout(10):
            while anon.restarts < 1:
                await asyncio.sleep(0.02)
        assert launches == 5 and not failures
        assert anon.pid not in (None, first)
        assert anon._supervisor is not None and not anon._supervisor.done()
    finally:
        await anon.stop()
    warnings = [r.getMessage() for r in caplog.records if "restart failed" in r.getMessage()]
    assert len(warnings) == 3 and "OSError: [Errno 28] No space left on device" in warnings[0]
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.WARNING)


def test_an_operators_daemon_on_a_unix_socket(tmp_path: Path) -> None:
    attached = daemon.AttachedAnon(socks=f"unix:{tmp_path}/socks.sock")
    url = attached.socks_url("backend-gpu0")
    assert url.startswith("socks5h://comfyveil-backend-gpu0:")
    assert url.endswith(f"@localhost{tmp_path}/socks.sock")
    with pytest.raises(errors.AnonError, match=r"127\.0\.0\.1:PORT or unix:/path"):
        daemon.AttachedAnon(socks="9050")


def test_client_keys_never_reach_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    private, _ = hidden.generate_keypair()
    key_file = tmp_path / "bot.auth_private"
    hidden.write_client_key_file(key_file, SERVICE_ID, private)
    hidden.read_client_key_file(key_file)
    redaction.install()
    text = key_file.read_text().strip()
    logging.getLogger("comfyveil.test").warning("loaded %s", text)
    assert text.split(":")[3] not in caplog.text and "[redacted]" in caplog.text
    onion = control.OnionService(SERVICE_ID, "ED25519-V3:secretsecret")
    assert "secretsecret" not in repr(onion)
