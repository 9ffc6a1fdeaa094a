"""The real parts the chaos run starts and breaks, all on loopback.

- PostgreSQL: pgserver's server in its own data directory (on a small tmpfs when the run
  may mount one, so the disk can be filled), stopped, killed -9 and started again here.
- Three fake ComfyUI servers (tests/fakes/comfyui.py, as strict as 0.3.64) in this
  process: a kill drops their queue and history, as a real crash does, and what each ran
  is counted per prompt id across restarts.
- The fake Bot API (tests/fakes/telegram.py) in this process.
- `comfyveil run` (bot, web, API and a worker) and two `comfyveil worker` processes,
  started from one configuration file, killed and started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram
from tests.fixtures.database import open_for_the_database_user

ROOT = Path(__file__).resolve().parents[2]
# Room for an hour's jobs (about 60 MiB at 2 requests a second, results included), the
# WAL between checkpoints (up to max_wal_size's reach in 5 minutes) and PostgreSQL's
# log (256 MiB had 44 MiB used after 4 minutes): the disk must fill only when a fault fills it.
TMPFS_BYTES = 512 * 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Postgres:
    """A PostgreSQL server this run can stop, kill and fill the disk of."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounted = False
        self.data = root / "pg" / "data"
        self.server: Any = None
        self.failures: list[str] = []

    def _mount(self) -> None:
        """A tmpfs of its own under the data, so filling it fills nothing else."""
        if os.geteuid() != 0 or shutil.which("mount") is None:
            return
        (self.root / "pg").mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(self.root / "pg")],
            capture_output=True,
            check=False,
        )
        self.mounted = done.returncode == 0

    async def start(self) -> str:
        self._mount()
        import pgserver

        open_for_the_database_user(self.data)
        self.server = await asyncio.to_thread(pgserver.get_server, self.data, cleanup_mode="stop")
        return str(self.server.get_uri())

    def pid(self) -> int | None:
        from pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.data)
        return info.pid if info is not None and info.is_running() else None

    async def stop(self) -> None:
        from pgserver._commands import pg_ctl

        await asyncio.to_thread(
            pg_ctl,
            ["-w", "-m", "fast", "stop"],
            pgdata=self.data,
            user=self.server.system_user,
            timeout=60,
        )

    async def kill(self) -> None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                if self.pid() is None:
                    break
                await asyncio.sleep(0.05)

    async def resume(self) -> None:
        """Start again after a stop or a kill (crash recovery after a kill). Recovery on a
        full or freshly freed disk may fail: tried again for two minutes; a server that
        still will not start is written down (`failures`), as a broken run, not a pass."""
        for _ in range(120):
            try:
                await asyncio.to_thread(self.server.ensure_postgres_running)
                return
            except Exception as exc:
                last = exc
                await asyncio.sleep(1)
        self.failures.append(f"PostgreSQL did not start again: {type(last).__name__} {last}")

    def fill_disk(self) -> Path | None:
        """Fill the tmpfs under the data; None when there is none to fill."""
        if not self.mounted:
            return None
        ballast = self.root / "pg" / "ballast"
        with contextlib.suppress(OSError), open(ballast, "wb") as out:
            block = b"\0" * (1024 * 1024)
            while True:
                out.write(block)
        return ballast

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.data.rglob("*") if p.is_file())

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.stop()
        with contextlib.suppress(OSError):  # kept for reading after the run
            shutil.copy(self.data / "log", self.root / "postgres.log")
        if self.mounted:
            await asyncio.to_thread(
                subprocess.run, ["umount", "-l", str(self.root / "pg")], check=False
            )


@dataclasses.dataclass
class Gpu:
    """A fake ComfyUI and what it ran, kept across its restarts."""

    name: str
    fake: FakeComfyUI
    executions: Counter[str] = dataclasses.field(default_factory=Counter)
    lost_mid_run: set[str] = dataclasses.field(default_factory=set)
    # Prompts that had run but whose images were not fetched yet (their history entry, which
    # the product deletes once the result is home, was still there): a restart empties
    # temp/ and the history, so the product must run them again.
    lost_before_fetch: set[str] = dataclasses.field(default_factory=set)

    def collect(self) -> None:
        """Move the fake's counts into ours before a restart forgets them."""
        self.executions.update(self.fake.executions)
        self.fake.executions.clear()

    def all_executions(self) -> Counter[str]:
        return self.executions + self.fake.executions

    def _note_losses(self) -> None:
        if self.fake.running is not None:
            self.lost_mid_run.add(self.fake.running.prompt_id)
        self.lost_before_fetch.update(self.fake.history_entries)

    async def crash(self) -> None:
        self._note_losses()
        self.collect()
        await self.fake.kill()

    async def stop(self) -> None:
        self._note_losses()
        self.collect()
        await self.fake.stop()

    async def restart(self) -> None:
        self.collect()
        await self.fake.restart()

    def leftovers(self) -> list[tuple[str, str]]:
        """Files that still hold a picture, each with the request token its prompt held
        ("" when unknown): the product overwrites what it cannot delete (ComfyUI has no
        route for that) with a 1x1 image."""
        import re

        from PIL import Image

        left = []
        for folder in self.fake.dirs.values():
            for path in folder.rglob("*"):
                if not path.is_file():
                    continue
                token = ""
                try:
                    with Image.open(path) as image:
                        if image.size == (1, 1):
                            continue
                        found = re.search(r"chaos-\d{6}", str(image.info.get("prompt", "")))
                        token = found.group(0) if found else ""
                except OSError:
                    pass
                left.append((str(path.relative_to(self.fake.root)), token))
        return left


IN_FLIGHT_S = 2.0  # see Process.ended_between


@dataclasses.dataclass
class Process:
    """A comfyveil process the run starts, kills and starts again."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    warm_rss: int | None = None
    warm_at: float | None = None  # when warm_rss was measured
    restarts: int = 0
    held_down: bool = False  # stopped by a fault, which starts it again
    exited_at: float | None = None
    exits: list[str] = dataclasses.field(default_factory=list)  # exits of its own
    # When it ended (killed, stopped or exited), time.monotonic(): a message sent twice is
    # a crash re-send only with one of these between the two.
    ended: list[float] = dataclasses.field(default_factory=list)

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=log, cwd=ROOT, start_new_session=True
            )
        self.started_at = time.monotonic()
        self.warm_rss = None
        self.warm_at = None
        self.held_down = False
        self.exited_at = None

    def supervise(self) -> None:
        """What systemd's Restart=on-failure, RestartSec=5 does (deploy/systemd): a
        process that exited by itself is started again 5 s later; its last log line says
        why it exited."""
        if self.proc is None or self.held_down or self.proc.poll() is None:
            return
        now = time.monotonic()
        if self.exited_at is None:
            self.exited_at = now
            self.ended.append(now)
            lines = self.log.read_text(errors="replace").strip().splitlines()
            self.exits.append(f"exit {self.proc.returncode}: {(lines or [''])[-1][:160]}")
        elif now - self.exited_at >= 5:
            self.restarts += 1
            self.start()

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signum)
            self.ended.append(time.monotonic())

    def ended_between(self, first: float, last: float) -> bool:
        """Whether it ended (or was told to) between two sends (time.monotonic()), or at
        most IN_FLIGHT_S before the first: the fakes run in this process's event loop, so
        a request the process had sent in full before it was killed is read, and timed,
        after the kill was recorded."""
        return any(first - IN_FLIGHT_S <= at <= last for at in self.ended)

    def ends_near(self, first: float, last: float) -> str:
        """Its ends around two sends, for a violation's detail (seconds from the first)."""
        near = [f"{at - first:+.1f}s" for at in self.ended if first - 30 <= at <= last + 30]
        return f"{self.name} ended at {', '.join(near) or 'none of the minute around'}"

    async def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.proc is not None and self.proc.poll() is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.1)
        return self.proc.returncode if self.proc else None

    def rss(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None
        with contextlib.suppress(psutil.Error):
            return int(psutil.Process(self.proc.pid).memory_info().rss)
        return None


class System:
    """Everything the run starts, in one temporary directory."""

    def __init__(self, *, anon: bool = False, verbose: bool = False) -> None:
        from tests.chaos.anon import ChaosAnon  # not at the top: it imports this module

        self.tmp = Path(tempfile.mkdtemp(prefix="comfyveil-chaos-"))
        self.tmp.chmod(0o755)  # PostgreSQL runs as another user when we are root
        self.postgres = Postgres(self.tmp)
        self.telegram = FakeTelegram()
        self.gpus: list[Gpu] = []
        self.processes: dict[str, Process] = {}
        self.web_url = ""
        self.database_url = ""
        # INFO logs as JSON lines carry each job's id beside its claim, backend and retry:
        # what a violation's cause is read from (WARNING, the default, names only failures).
        self.verbose = verbose
        self.config = self.tmp / "comfyveil.toml"
        self.anon = ChaosAnon(self.tmp / "anon") if anon else None

    async def start(self) -> None:
        self.database_url = await self.postgres.start()
        await self.telegram.start()
        self.telegram.enforce_limits()  # as Telegram always does
        for index in range(3):
            fake = FakeComfyUI(root=self.tmp / f"gpu{index}")
            await fake.start()
            self.gpus.append(Gpu(f"gpu{index}", fake))
        port = free_port()
        self.web_url = f"http://127.0.0.1:{port}"
        urls = {gpu.name: gpu.fake.url for gpu in self.gpus}
        anyone = ""
        if self.anon is not None:  # the last GPU behind a hidden service
            anyone = await self.anon.start(self.gpus[-1])
            urls[self.gpus[-1].name] = self.anon.url()
        backends = "".join(
            f'[[backends]]\nname = "{name}"\nurl = "{url}"\n'
            + ('via = "direct"\n' if url.startswith("http://127.") else "")
            for name, url in urls.items()
        )
        data_dir = self.tmp / "data"
        data_dir.mkdir(mode=0o700)
        self.config_text = (
            f'data_dir = "{data_dir}"\n'
            f'[database]\nurl = "{self.database_url}"\n'
            f'[telegram]\napi_url = "{self.telegram.url}"\nopen = true\npoll_timeout = 1\n'
            "status_delay = 0\n"
            # Many simulated users share few ids: their caps would refuse most requests.
            "[limits]\ndaily_quota = 100000\nmax_queued = 50\ncooldown = 0\n"
            "[worker]\nlease_seconds = 10\nmax_wait_offline = 120\njob_timeout = 120\n"
            "stop_grace = 3\n"
            f"[web]\nport = {port}\npassphrase_memory_mib = 19\npassphrase_iterations = 2\n"
            "[api]\nenabled = true\n" + anyone + backends
        )
        self.config.write_text(self.config_text)
        self.config.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYVEIL_")}
        env.pop("DATABASE_URL", None)
        env["COMFYVEIL_TELEGRAM_TOKEN"] = self.telegram.token
        env["COMFYVEIL_ANYONE_FORBID_PUBLIC"] = "1"
        logging = ["-v", "--log-format", "json"] if self.verbose else []
        python = [sys.executable, "-m", "comfyveil", *logging]
        self.processes["run"] = Process(
            "run", [*python, "run", "--config", str(self.config)], env, self.tmp / "run.log"
        )
        for index in range(2):
            name = f"worker{index}"
            self.processes[name] = Process(
                name,
                [*python, "worker", "--config", str(self.config), "--id", name],
                env,
                self.tmp / f"{name}.log",
            )
        for process in self.processes.values():
            process.start()
        await self.wait_web()

    def set_retention_days(self, days: float) -> None:
        """For the processes started from now on."""
        self.config.write_text(f"{self.config_text}[privacy]\njob_retention_days = {days}\n")

    async def wait_web(self, timeout: float = 90) -> None:
        import aiohttp

        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(self.web_url + "/login") as response:
                        if response.status < 500:
                            return
                await asyncio.sleep(0.5)
        raise RuntimeError(f"the web front end did not answer; see {self.tmp / 'run.log'}")

    async def jobs_for(self, token: str) -> list[dict[str, Any]]:
        """The jobs whose prompt holds `token` (a request of this run)."""
        return await self.query(
            "SELECT id, status, chat_id, user_id, error, status_message_id, attempts"
            " FROM jobs WHERE params->>'prompt' LIKE %s",
            (f"{token} %",),
        )

    async def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        import psycopg
        from psycopg.rows import dict_row

        async with await psycopg.AsyncConnection.connect(
            self.database_url, row_factory=dict_row, connect_timeout=5
        ) as conn:
            cursor = await conn.execute(sql, args)
            return list(await cursor.fetchall())

    async def execute(self, sql: str) -> None:
        """A statement outside a transaction (VACUUM)."""
        import psycopg

        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True, connect_timeout=5
        ) as conn:
            await conn.execute(sql)

    async def cli(self, *args: str, timeout: float = 120) -> tuple[int, str, str]:
        """A `comfyveil` command, as an operator runs it."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "comfyveil",
            *args,
            "--config",
            str(self.config),
            env=self.processes["run"].env,
            cwd=self.tmp,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            return -1, out.decode(), err.decode() + "\n(timed out)"
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def stop(self) -> list[str]:
        """Stop everything; the processes left behind (orphans), if any."""
        for process in self.processes.values():
            process.signal(signal.SIGTERM)
        for process in self.processes.values():
            if await process.wait(30) is None:
                process.signal(signal.SIGKILL)
                await process.wait(10)
        for gpu in self.gpus:
            gpu.collect()
            await gpu.fake.stop()
        await self.telegram.close()
        if self.anon is not None:  # before the search for processes left behind
            await self.anon.close()
        await self.postgres.close()
        await asyncio.sleep(1)
        # Children of this run, and any process anywhere still naming its directory (a
        # child of a killed process that outlived it, re-parented to init).
        me = psutil.Process()
        left: dict[int, str] = {}
        children = {p.pid for p in me.children(recursive=True)}
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                line = " ".join(proc.cmdline())
                if proc.pid in children or str(self.tmp) in line:
                    left[proc.pid] = f"{proc.pid} {line[:120]}"
        return list(left.values())
