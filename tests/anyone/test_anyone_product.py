"""The product on the Anyone network: `comfyveil generate` and a worker job against a
FakeComfyUI published as a hidden service with client authorization, on the session's
private network (127.0.0.1 only).

The fake listens on a loopback port that no command under test is told: the
configuration names only the `.anon` address and the client key, so every request the
fake records came through anon's hidden service.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from PIL import Image

from comfyveil import config, config_load, sinks
from comfyveil.anyone import daemon, errors, hidden, runtime
from comfyveil.anyone import network as network_mod
from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import pool
from comfyveil.store import database, jobs
from comfyveil.worker import Worker
from tests import zygote
from tests.fakes.comfyui import FakeComfyUI
from tests.fixtures.anyone import AnonPair, PrivateAnyoneNetwork
from tests.integration.worker_support import FAST, enqueue, wait_for, wait_status

REPO = Path(__file__).resolve().parents[2]
COPY_WORKFLOW = REPO / "tests" / "data" / "noise_copy.toml"
IMAGE_SIDE = 600  # 600 x 600 RGB noise: a PNG of about 1.08 MB


@dataclass
class HiddenComfy:
    fake: FakeComfyUI
    address: str  # "<56 characters>.anon"
    key_file: Path  # the bot host's client key, mode 0600

    @property
    def url(self) -> str:
        return f"http://{self.address}"


@pytest.fixture(scope="module")
async def hidden_comfy(
    anon_pair: AnonPair, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[HiddenComfy]:
    """One FakeComfyUI, published by the GPU host's anon with client authorization on."""
    root = tmp_path_factory.mktemp("hidden-comfy")
    fake = FakeComfyUI(root=root / "comfyui")
    await fake.start()
    private, public = hidden.generate_keypair()
    address = await anon_pair.gpu_host.add_ephemeral(
        f"127.0.0.1:{fake.port}", client_auth_v3=[hidden.public_key_b32(public)]
    )
    service_id, _ = hidden.split_address(address)
    key_file = root / "keys" / "bot.auth_private"
    hidden.write_client_key_file(key_file, service_id, private)
    try:
        yield HiddenComfy(fake, address, key_file)
    finally:
        with contextlib.suppress(errors.AnonError):
            await anon_pair.gpu_host.remove_ephemeral(address)
        await fake.stop()


@pytest.fixture(scope="module")
def noisy_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    image = Image.frombytes("RGB", (IMAGE_SIDE, IMAGE_SIDE), os.urandom(IMAGE_SIDE**2 * 3))
    path = tmp_path_factory.mktemp("noise") / "noise.png"
    image.save(path, "PNG")
    assert path.stat().st_size > 1_000_000
    return path


def _pixels(data: bytes) -> bytes:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB").tobytes()


async def _generate(*args: str, cwd: Path, timeout: float = 240) -> tuple[int, str, str]:
    proc = await zygote.comfyveil(
        "generate", *args, cwd=cwd, env=dict(os.environ),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _check_copy(stdout: str, noisy_png: Path) -> None:
    paths = [Path(line) for line in stdout.splitlines() if line.strip()]
    assert len(paths) == 1, stdout
    saved = paths[0].read_bytes()
    assert len(saved) > 1_000_000
    assert _pixels(saved) == _pixels(noisy_png.read_bytes())


def _hidden_config(
    tmp_path: Path, anyone_network: PrivateAnyoneNetwork, hidden: HiddenComfy,
    more: str = "",
) -> Path:
    """A settings file naming the hidden ComfyUI by its .anon address and client key
    only, with our own anon on the session's private network; `more` is appended."""
    assert anyone_network.network is not None
    net_file = tmp_path / "private-network.txt"
    net_file.write_text(anyone_network.network.to_file_text())
    cfg = tmp_path / "comfyveil.toml"
    cfg.write_text(
        f'data_dir = "{tmp_path / "data"}"\n\n'
        f'[[backends]]\nname = "hidden"\nurl = "{hidden.url}"\n'
        f'auth_key_file = "{hidden.key_file}"\n\n'
        f'[anyone]\nbinary = "{anyone_network.binary}"\nprivate_network = "{net_file}"\n\n'
        + more
    )
    assert f":{hidden.fake.port}" not in cfg.read_text()  # only the .anon address
    return cfg


def _paths_seen(fake: FakeComfyUI, since: int) -> set[tuple[str, str]]:
    return {(r.method, r.path.removeprefix("/api")) for r in fake.requests[since:]}


# -- generate, with our own anon on the private network ---------------------------------


@pytest.mark.anyone
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_generate_reaches_a_hidden_comfyui_with_its_client_key(
    anyone_network: PrivateAnyoneNetwork, hidden_comfy: HiddenComfy, noisy_png: Path,
    tmp_path: Path,
) -> None:
    cfg = _hidden_config(tmp_path, anyone_network, hidden_comfy)
    seen = len(hidden_comfy.fake.requests)
    code, out, err = await _generate(
        str(COPY_WORKFLOW), "--image", str(noisy_png), "--out", str(tmp_path / "out"),
        "--config", str(cfg), "--timeout", "120", cwd=tmp_path,
    )
    assert code == 0, err[-2000:]
    assert "anon: 100%" in err
    _check_copy(out, noisy_png)
    # HTTP (upload, submit, the history deletion) and the WebSocket (which also brought
    # the image back: no trace) all reached the fake via anon.
    paths = _paths_seen(hidden_comfy.fake, seen)
    assert {("POST", "/upload/image"), ("POST", "/prompt"), ("GET", "/ws"),
            ("POST", "/history")} <= paths
    # Our anon ran in the command's own state directory and is gone with it.
    assert (tmp_path / "data" / "anon" / "state" / "anonrc").is_file()
    assert "TestingTorNetwork 1" in (tmp_path / "data" / "anon" / "state" / "anonrc").read_text()


# -- generate through the operator's anon: what the SOCKS port is asked ----------------


@dataclass
class RecordingRelay:
    """Relays SOCKS5 on 127.0.0.1 to anon's SOCKS socket and records each CONNECT
    request (the operator's daemon, configured with a TCP SOCKS port)."""

    upstream: Path  # the anon's SOCKS socket
    requests: list[tuple[str, str, int, str]] = field(default_factory=list)  # atyp, host...
    server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(str(self.upstream))
        try:
            head = await reader.readexactly(2)
            methods = await reader.readexactly(head[1])
            up_writer.write(head + methods)
            choice = await up_reader.readexactly(2)
            writer.write(choice)
            user = ""
            if choice[1] == 2:
                ver_len = await reader.readexactly(2)
                name = await reader.readexactly(ver_len[1])
                plen = await reader.readexactly(1)
                password = await reader.readexactly(plen[0])
                user = name.decode()
                up_writer.write(ver_len + name + plen + password)
                writer.write(await up_reader.readexactly(2))
            header = await reader.readexactly(4)
            if header[3] == 3:
                length = await reader.readexactly(1)
                raw = length + await reader.readexactly(length[0])
                kind, host = "domain", raw[1:].decode()
            elif header[3] == 1:
                raw = await reader.readexactly(4)
                kind, host = "ipv4", ".".join(str(b) for b in raw)
            else:
                raw = await reader.readexactly(16)
                kind, host = "ipv6", raw.hex()
            port = await reader.readexactly(2)
            self.requests.append((kind, host, struct.unpack("!H", port)[0], user))
            up_writer.write(header + raw + port)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            up_writer.close()
            writer.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.write_eof()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server:
            self.server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.server.wait_closed(), 5)


@pytest.mark.anyone
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_generate_sends_the_hidden_name_to_socks_never_resolving_it(
    anon_pair: AnonPair, hidden_comfy: HiddenComfy, noisy_png: Path, tmp_path: Path,
) -> None:
    """[anyone] socks: the operator's daemon (the session client behind a recording relay)."""
    client = anon_pair.client
    await client.add_client_key(hidden_comfy.key_file)  # the operator configured the key
    assert client.socks_path is not None
    relay = RecordingRelay(client.socks_path)
    relay_port = await relay.start()
    cfg = tmp_path / "comfyveil.toml"
    cfg.write_text(
        f'data_dir = "{tmp_path / "data"}"\n\n'
        f'[[backends]]\nname = "hidden"\nurl = "{hidden_comfy.url}"\n\n'
        f'[anyone]\nsocks = "127.0.0.1:{relay_port}"\n'
    )
    try:
        code, out, err = await _generate(
            str(COPY_WORKFLOW), "--image", str(noisy_png), "--out", str(tmp_path / "out"),
            "--server", hidden_comfy.url, "--config", str(cfg), "--timeout", "120",
            cwd=tmp_path,
        )
    finally:
        await relay.stop()
    assert code == 0, err[-2000:]
    _check_copy(out, noisy_png)
    assert not (tmp_path / "data" / "anon").exists(), "started an anon of its own"
    # HTTP and the WebSocket: every connection asked anon for the name itself.
    assert len(relay.requests) >= 2
    for kind, host, port, user in relay.requests:
        assert (kind, host, port) == ("domain", hidden_comfy.address, 80)
        assert user == "comfyveil-backend-hidden"


# -- a worker job, and anon killed in the middle of it ---------------------------------


@pytest.mark.anyone
@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_worker_job_through_anon_survives_anon_being_killed(
    anyone_network: PrivateAnyoneNetwork, hidden_comfy: HiddenComfy,
    db: database.Database, tmp_path: Path,
) -> None:
    settings = config_load.from_mapping(
        {"data_dir": str(tmp_path / "data"),
         "anyone": {"binary": str(anyone_network.binary)}}, environ={},
    )
    backend = config.BackendConfig("hidden", hidden_comfy.url,
                                   auth_key_file=hidden_comfy.key_file)
    fake = hidden_comfy.fake
    sink = sinks.FileSink(tmp_path / "out")
    try:
        async with runtime.anon_for(settings, [backend],
                                    network=anyone_network.network) as router:
            anon = router.anon
            assert isinstance(anon, runtime.process.ManagedAnon)
            proxy = router.proxy_for(backend)
            assert proxy is not None and proxy.startswith("socks5h://")
            async with pool.Pool([backend], proxy_for=router.proxy_for,
                                 probe_interval=0.5) as backends:
                worker = Worker(db, backends, sinks=[sink], options=FAST)
                task = asyncio.create_task(worker.run(), name="anyone-worker")
                try:
                    first = await enqueue(db, steps=2)
                    await wait_status(db, first.id, jobs.Status.SUCCEEDED, timeout=120)
                    fake.step_delay = 2.0
                    job = await enqueue(db, steps=4)  # 8 s on the fake GPU

                    async def on_gpu() -> bool:
                        return fake.running is not None

                    await wait_for(on_gpu, 60)
                    old_pid = anon.pid
                    assert old_pid is not None
                    os.kill(old_pid, signal.SIGKILL)
                    done = await wait_status(db, job.id, jobs.Status.SUCCEEDED,
                                             jobs.Status.FAILED, timeout=240)
                finally:
                    worker.stop()
                    await asyncio.wait_for(task, 60)
            assert anon.restarts >= 1 and anon.pid not in (None, old_pid)
    finally:
        fake.step_delay = 0.0
    if done.status is jobs.Status.FAILED:  # allowed, but never silently
        assert done.error and "Traceback" not in done.error
        pytest.fail(f"job failed after anon restarted: {done.error}")
    assert len([p for p in sink.delivered if str(job.id) in p.name]) >= 1


# -- `comfyveil worker` as its own process, as on a host apart from the GPU -------------


@pytest.mark.anyone
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_worker_process_runs_a_queued_job_on_a_hidden_comfyui(
    anyone_network: PrivateAnyoneNetwork, hidden_comfy: HiddenComfy,
    db: database.Database, database_url: str, tmp_path: Path,
) -> None:
    """The deployment the README describes: the worker knows the GPU host only by its
    .anon address and client key, starts its own anon, and stops cleanly on SIGTERM."""
    cfg = _hidden_config(
        tmp_path, anyone_network, hidden_comfy,
        f'[database]\nurl = "{database_url}"\n\n[worker]\npoll_interval = 0.5\n',
    )
    seen = len(hidden_comfy.fake.requests)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    proc = await zygote.comfyveil(
        "worker", "--config", str(cfg), "--out", str(out),
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        job = await enqueue(db, steps=2, prompt="a fox behind seven proxies")
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, jobs.Status.FAILED,
                                 timeout=180)
        assert done.status is jobs.Status.SUCCEEDED, done.error
        assert done.backend == "hidden"

        async def saved() -> bool:
            return out.is_dir() and any(out.iterdir())

        await wait_for(saved, timeout=30)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()[-2000:]
    [result] = list(out.iterdir())
    assert result.read_bytes() == (await db.jobs.outputs(job.id))[0].data
    paths = _paths_seen(hidden_comfy.fake, seen)
    # The image came back over the WebSocket (no trace), then the history was deleted.
    assert {("POST", "/prompt"), ("GET", "/ws"), ("POST", "/history")} <= paths
    assert "a fox behind seven proxies" not in err.decode()  # prompts stay out of logs
    # The worker's anon ran in its own state directory, on the private network.
    anonrc = tmp_path / "data" / "anon" / "state" / "anonrc"
    assert "TestingTorNetwork 1" in anonrc.read_text()


# -- no network needed ------------------------------------------------------------------


def _settings(tmp_path: Path, **anyone: object) -> config.Settings:
    return config_load.from_mapping({"data_dir": str(tmp_path / "data"), "anyone": anyone},
                               environ={})


async def test_direct_backends_start_no_anon(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    local = config.BackendConfig("local", "http://127.0.0.1:8188")
    async with runtime.anon_for(settings, [local]) as router:
        assert router.anon is None
        assert router.proxy_for(local) is None
        assert router.telegram_proxy() is None
    assert not (tmp_path / "data" / "anon").exists()


async def test_hidden_backend_without_a_chosen_network_is_refused_in_tests(
    tmp_path: Path,
) -> None:
    """No network argument, no [anyone] private_network: that means the public network,
    which the test suite forbids; nothing is written, nothing is started."""
    settings = _settings(tmp_path)
    onion = config.BackendConfig("gpu", "http://" + "a" * 56 + ".anon")
    with pytest.raises(errors.PublicNetworkForbidden):
        async with runtime.anon_for(settings, [onion]):
            pass
    assert not (tmp_path / "data" / "anon").exists()


async def test_hidden_backend_with_anyone_disabled_says_so(tmp_path: Path) -> None:
    settings = _settings(tmp_path, enabled=False)
    onion = config.BackendConfig("gpu", "http://" + "a" * 56 + ".anon")
    with pytest.raises(errors.AnonError, match=r"backend gpu .* enabled is false"):
        async with runtime.anon_for(settings, [onion]):
            pass


def test_network_choice(tmp_path: Path) -> None:
    explicit = network_mod.PrivateNetwork(("a orport=1 no-v2 v3ident=AA 127.0.0.1:2 BB",))
    net_file = tmp_path / "net.txt"
    net_file.write_text(explicit.to_file_text())
    assert runtime.choose_network(_settings(tmp_path), explicit) is explicit
    from_file = runtime.choose_network(_settings(tmp_path, private_network=str(net_file)))
    assert from_file == explicit
    assert isinstance(runtime.choose_network(_settings(tmp_path)), network_mod.PublicNetwork)


def test_telegram_alone_needs_anon_only_for_the_bot(tmp_path: Path) -> None:
    settings = _settings(tmp_path, telegram=True)
    local = config.BackendConfig("local", "http://127.0.0.1:8188")
    assert runtime.needs_anon(settings, [local]) == []
    assert runtime.needs_anon(settings, [local], telegram=True) == [
        "Telegram ([anyone] telegram)"]


def test_two_processes_get_two_state_directories(tmp_path: Path) -> None:
    base = tmp_path / "anon" / "state"
    with runtime._state_dir(base) as first, runtime._state_dir(base) as second:
        assert first == base and second == base.with_name("state-1")
    with runtime._state_dir(base) as again:
        assert again == base  # released at exit


class _CountingAnon(daemon.AnonClient):
    """Stands in for a managed anon: counts NEWNYM requests."""

    def __init__(self) -> None:
        super().__init__()
        self.socks_port = 9999
        self.suffix = ".anon"
        self.newnyms = 0

    async def new_identity(self) -> None:
        self.newnyms += 1


async def test_a_failing_hidden_backend_gets_fresh_circuits_before_the_next_try(
    tmp_path: Path,
) -> None:
    anon = _CountingAnon()
    settings = config_load.from_mapping({}, environ={"COMFYVEIL_DATA_DIR": str(tmp_path)})
    router = runtime.Router(anon, settings)
    hidden_backend = config.BackendConfig("cloud", "http://" + "a" * 56 + ".anon")
    local = config.BackendConfig("gpu0", "http://127.0.0.1:1", via="direct")

    class Down:
        """A client whose backend cannot be reached."""

        def __init__(self, cfg: config.BackendConfig, proxy: str | None) -> None:
            self.name = cfg.name

        async def __aenter__(self) -> Down:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        async def queue(self) -> object:
            raise comfy_errors.BackendUnreachable(backend=self.name)

        system_stats = object_info = queue

    async with pool.Pool([hidden_backend, local], proxy_for=router.proxy_for,
                         client_factory=Down, on_down=router.backend_down,
                         probe_interval=60) as backends:
        # Both failed their first probe; only the hidden one is anon's business.
        assert not backends.get("cloud").healthy and not backends.get("gpu0").healthy
        assert anon.newnyms == 1
        await backends.mark_down(backends.get("gpu0"), "refused")
        await backends.mark_down(backends.get("cloud"), "still nothing")
        assert anon.newnyms == 1  # anon ignores NEWNYM within 10 s; so do we
