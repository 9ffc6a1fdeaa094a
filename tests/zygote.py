"""`python -m comfyveil` processes forked from a warm interpreter, for the tests.

Why: a fresh `python -m comfyveil` spends most of its CPU importing (0.5 s for `jobs`,
1 s for `generate`, 1.2 s for `run` on the 2-core reference machine), and the suite
starts about 150 of them: a quarter of the suite's CPU went to imports it had already
done. A zygote, one for the whole run (the xdist controller starts it before its workers:
`start_shared`), imports every subcommand once; each command then runs in a child forked
from it. The child is a real process of its own, as the product
runs: its own pid, stdin/stdout/stderr, working directory, environment, session and
signals, and its exit status is the one `comfyveil/__main__.py` gives, run by runpy as
`python -m` runs it. Only the imports are shared (and with them whatever a module does
when imported: a module that read the environment at import time would read the
zygote's, so none does; `_warm` finds the one that writes it, set again in each child).

The interpreter's own start is still tested by fresh processes: `--version`, `run
--help` importing only its subcommand (tests/unit/test_cli.py), the docs' shell
examples and the chaos harness.

Run as `python -m tests.zygote SOCKET`, it is the zygote; imported, it is the client.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import importlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
PIPE = asyncio.subprocess.PIPE
STDOUT = asyncio.subprocess.STDOUT
DEVNULL = asyncio.subprocess.DEVNULL
_HEADER = struct.Struct("!I")
_STATUS = struct.Struct("!i")


# The zygote ----------------------------------------------------------------------------


def _warm() -> dict[str, str]:
    """Import what every subcommand imports; the environment variables those imports set
    (a fresh process sets them too, after its environment was given)."""
    before = dict(os.environ)
    from comfyveil import cli

    for name in cli.SUBCOMMANDS:
        importlib.import_module(f"comfyveil.cli.{name}")
    return {k: v for k, v in os.environ.items() if k not in before}


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("the client left mid-request")
        data += more
    return json.loads(data[_HEADER.size:]), fds


def _serve(path: str) -> tuple[dict[str, Any], list[int]] | None:
    """Fork a child per request until stdin closes (the test worker is gone). Returns only
    in a child: its request and its three descriptors."""
    added = _warm()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    selector.register(0, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    gc.freeze()  # the imports' objects stay shared with the children, not copied on write
    while True:
        for key, _events in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn)
                except (OSError, EOFError, ValueError):
                    conn.close()
                    continue
                assert threading.active_count() == 1  # forking with threads is unsafe
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for other in children.values():
                        other.close()
                    conn.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    request["added"] = added
                    return request, fds
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                conn.sendall(_STATUS.pack(pid))
            elif key.fileobj == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                _reap(children)
            elif not os.read(0, 512):
                return None


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(_STATUS.pack(os.waitstatus_to_exitcode(status)))
            conn.close()


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """Turn this child into `python -m comfyveil ARGS` as the client asked for it."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for name, value in request["added"].items():
        os.environ.setdefault(name, value)
    sys.path[0] = str(Path.cwd())  # where `python -m` puts the directory it started in
    sys.argv = ["-m", *request["args"]]
    runpy.run_module("comfyveil", run_name="__main__", alter_sys=True)


# The client ----------------------------------------------------------------------------


# Where the xdist controller's zygote listens (`start_shared`): the workers, started after
# it, inherit the variable and fork their commands there.
SHARED_ENV = "TESTS_ZYGOTE_SOCKET"
_SHARED = os.environ.pop(SHARED_ENV, None)  # read in a worker; its commands need not see it


class _Zygote:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.path = ""

    def socket_path(self) -> str:
        if _SHARED:
            return _SHARED
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            return self.path

    def _start(self) -> None:
        directory = tempfile.mkdtemp(prefix="comfyveil-zygote-")  # 0700: ours alone
        self.path = str(Path(directory) / "socket")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", self.path],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline() != b"ready\n":
            raise RuntimeError("the test zygote did not start (tests/zygote.py)")
        atexit.register(self._stop, self.proc, directory)

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes], directory: str) -> None:
        if proc.stdin is not None:
            proc.stdin.close()  # the zygote leaves when its stdin closes
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        shutil.rmtree(directory, ignore_errors=True)


_zygote = _Zygote()


def start_shared() -> None:
    """Start one zygote for the whole run, from the xdist controller before its workers:
    each worker started its own, and each zygote's imports cost about 2 s of CPU."""
    _zygote.socket_path()
    os.environ[SHARED_ENV] = _zygote.path


class Process:
    """The parts of asyncio.subprocess.Process that the tests use."""

    def __init__(self, pid: int, status: socket.socket, stdin: asyncio.StreamWriter | None,
                 stdout: asyncio.StreamReader | None, stderr: asyncio.StreamReader | None
                 ) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._exited = asyncio.get_running_loop().create_task(self._status(status))

    async def _status(self, status: socket.socket) -> int:
        loop = asyncio.get_running_loop()
        data = b""
        try:
            while len(data) < _STATUS.size:
                more = await loop.sock_recv(status, _STATUS.size - len(data))
                if not more:
                    raise RuntimeError(f"the test zygote lost process {self.pid}")
                data += more
        finally:
            status.close()
        self.returncode = _STATUS.unpack(data)[0]
        return self.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        async def feed() -> None:
            if self.stdin is not None:
                if input:
                    self.stdin.write(input)
                    with contextlib.suppress(ConnectionError):
                        await self.stdin.drain()
                self.stdin.close()

        async def read(stream: asyncio.StreamReader | None) -> bytes | None:
            return None if stream is None else await stream.read()

        _, out, err = await asyncio.gather(feed(), read(self.stdout), read(self.stderr))
        await self.wait()
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def _reader(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**16)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader


async def _writer(fd: int) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", buffering=0)
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)


def _fd_for(where: int | IO[Any] | None, default: int, mode: int) -> tuple[int, bool]:
    """The descriptor the child gets for `where`, and whether it is ours to close."""
    if where is None:
        return default, False
    if where == DEVNULL:
        return os.open(os.devnull, mode), True
    if isinstance(where, int):
        return where, False
    return where.fileno(), False


async def comfyveil(
    *args: str,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int | IO[Any] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    start_new_session: bool = False,
) -> Process:
    """`python -m comfyveil ARGS`, as asyncio.create_subprocess_exec would start it."""
    theirs: list[int] = []  # the child's ends, closed here once it has them
    ours: dict[str, int] = {}
    fds = []
    for name, where, default, mode in (
        ("stdin", stdin, 0, os.O_RDONLY),
        ("stdout", stdout, 1, os.O_WRONLY),
        ("stderr", stderr, 2, os.O_WRONLY),
    ):
        if where == PIPE:
            read_end, write_end = os.pipe()
            child_end, our_end = (read_end, write_end) if name == "stdin" else (write_end, read_end)
            ours[name] = our_end
            theirs.append(child_end)
            fds.append(child_end)
        elif where == STDOUT:
            fds.append(fds[1])
        else:
            fd, close = _fd_for(where, default, mode)
            if close:
                theirs.append(fd)
            fds.append(fd)
    request = json.dumps({
        "args": list(args),
        "cwd": os.fspath(cwd) if cwd is not None else str(Path.cwd()),
        "env": dict(os.environ if env is None else env),
        "new_session": start_new_session,
    }).encode()
    path = await asyncio.to_thread(_zygote.socket_path)
    status = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        status.connect(path)
        message = _HEADER.pack(len(request)) + request
        sent = socket.send_fds(status, [message[:4096]], fds)
        status.sendall(message[sent:])
        pid_bytes = b""
        while len(pid_bytes) < _STATUS.size:
            more = status.recv(_STATUS.size - len(pid_bytes))
            if not more:
                raise RuntimeError("the test zygote refused a process (tests/zygote.py)")
            pid_bytes += more
    except BaseException:
        status.close()
        for fd in ours.values():
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    status.setblocking(False)
    return Process(
        _STATUS.unpack(pid_bytes)[0],
        status,
        await _writer(ours["stdin"]) if "stdin" in ours else None,
        await _reader(ours["stdout"]) if "stdout" in ours else None,
        await _reader(ours["stderr"]) if "stderr" in ours else None,
    )


if __name__ == "__main__":
    child = _serve(sys.argv[1])
    if child is not None:
        _become(*child)
