"""The fault schedule: every few seconds one fault, drawn from the run's seed.

Each fault undoes itself (a killed process is started again, a stopped database comes
back, a held route is released), so the system is whole again when faults stop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from tests.chaos.system import System

# kind -> weight; the processes' faults are the commonest, as in a real fleet's week
WEIGHTS = {
    "worker-sigkill": 8,
    "worker-sigterm": 5,
    "run-sigkill": 5,
    "run-sigterm": 3,
    "gpu-crash": 4,
    "gpu-sigterm": 2,
    "postgres-stop": 4,
    "postgres-sigkill": 3,
    "gpu-500": 5,
    "gpu-hangs-upload": 3,
    "gpu-hangs-download": 3,
    "telegram-429": 4,
    "telegram-500": 4,
    "telegram-502": 2,
    "telegram-timeout": 3,
    "telegram-slow": 3,
    "disk-full": 2,
}


@dataclasses.dataclass
class Injected:
    at: float
    kind: str
    detail: str


class Faults:
    weights = WEIGHTS  # the anon mode adds its kinds (tests/chaos/anon.py)

    def __init__(self, system: System, rng: random.Random, *, every: tuple[float, float]):
        self.system = system
        self.rng = rng
        self.every = every
        self.log: list[Injected] = []
        self.skipped: Counter[str] = Counter()
        self._healing: set[asyncio.Task[None]] = set()
        self.running = True

    def counts(self) -> Counter[str]:
        return Counter(f.kind for f in self.log)

    async def run(self, until: float) -> None:
        while self.running and time.monotonic() < until:
            await asyncio.sleep(self.rng.uniform(*self.every))
            kind = self.rng.choices(list(self.weights), weights=list(self.weights.values()))[0]
            inject = getattr(self, "_" + kind.replace("-", "_"))
            detail = await inject()
            if detail is None:
                self.skipped[kind] += 1
            else:
                self.log.append(Injected(time.monotonic(), kind, detail))
                with open(self.system.tmp / "faults.log", "a") as out:
                    out.write(f"{time.strftime('%H:%M:%S')} {kind}: {detail}\n")

    def _later(self, seconds: float, heal: Callable[[], Awaitable[None]]) -> None:
        async def wait_and_heal() -> None:
            await asyncio.sleep(seconds)
            await heal()

        task = asyncio.create_task(wait_and_heal())
        self._healing.add(task)
        task.add_done_callback(self._healing.discard)

    async def settle(self) -> None:
        """Stop injecting; let every pending heal happen."""
        self.running = False
        while self._healing:
            await asyncio.gather(*list(self._healing), return_exceptions=True)

    # -- processes ------------------------------------------------------------------

    async def _kill(self, name: str, signum: int) -> str | None:
        process = self.system.processes[name]
        if process.proc is None or process.proc.poll() is not None:
            return None
        process.held_down = True
        process.signal(signum)
        if signum == signal.SIGTERM and await process.wait(30) is None:
            process.signal(signal.SIGKILL)
        await process.wait(10)
        pause = self.rng.uniform(0.5, 5)

        async def again() -> None:
            process.restarts += 1
            process.start()

        self._later(pause, again)
        return f"{name}, back after {pause:.1f} s"

    async def _worker_sigkill(self) -> str | None:
        return await self._kill(self.rng.choice(["worker0", "worker1"]), signal.SIGKILL)

    async def _worker_sigterm(self) -> str | None:
        return await self._kill(self.rng.choice(["worker0", "worker1"]), signal.SIGTERM)

    async def _run_sigkill(self) -> str | None:
        return await self._kill("run", signal.SIGKILL)

    async def _run_sigterm(self) -> str | None:
        return await self._kill("run", signal.SIGTERM)

    # -- GPUs -----------------------------------------------------------------------

    async def _gpu_crash(self) -> str | None:
        gpu = self.rng.choice(self.system.gpus)
        if gpu.fake._runner is None:
            return None
        running = gpu.fake.running.prompt_id if gpu.fake.running else None
        await gpu.crash()
        pause = self.rng.uniform(1, 10)
        self._later(pause, gpu.restart)
        return f"{gpu.name} (running {running}), back empty after {pause:.1f} s"

    async def _gpu_sigterm(self) -> str | None:
        """ComfyUI stopped by its service manager: connections close, it comes back empty."""
        gpu = self.rng.choice(self.system.gpus)
        if gpu.fake._runner is None:
            return None
        running = gpu.fake.running.prompt_id if gpu.fake.running else None
        await gpu.stop()
        pause = self.rng.uniform(1, 10)
        self._later(pause, gpu.restart)
        return f"{gpu.name} (running {running}) stopped, back empty after {pause:.1f} s"

    async def _gpu_500(self) -> str | None:
        gpu = self.rng.choice(self.system.gpus)
        path = self.rng.choice(["/prompt", "/view", "/upload/image", "/history"])
        times = self.rng.randint(1, 4)
        gpu.fake.fail_requests(path, times)
        return f"{gpu.name} {path} x{times}"

    async def _hold(self, path: str, method: str) -> str | None:
        gpu = self.rng.choice(self.system.gpus)
        gpu.fake.hold(path, method)
        pause = self.rng.uniform(3, 20)

        async def release() -> None:
            gpu.fake.release(path, method)

        self._later(pause, release)
        return f"{gpu.name} {method} {path} for {pause:.1f} s"

    async def _gpu_hangs_upload(self) -> str | None:
        return await self._hold("/upload/image", "POST")

    async def _gpu_hangs_download(self) -> str | None:
        return await self._hold("/view", "GET")

    # -- PostgreSQL -------------------------------------------------------------------

    async def _postgres_stop(self) -> str | None:
        pause = self.rng.choice([self.rng.uniform(1, 8), self.rng.uniform(8, 30)])
        if self.system.postgres.pid() is None:
            return None  # still down from an earlier fault: pg_ctl stop would fail
        await self.system.postgres.stop()
        self._later(pause, self.system.postgres.resume)
        return f"stopped for {pause:.1f} s"

    async def _postgres_sigkill(self) -> str | None:
        await self.system.postgres.kill()
        await self.system.postgres.resume()
        return "killed -9, crash recovery"

    async def _disk_full(self) -> str | None:
        ballast = await asyncio.to_thread(self.system.postgres.fill_disk)
        if ballast is None:
            return None

        async def free() -> None:
            ballast.unlink(missing_ok=True)
            if self.system.postgres.pid() is None:  # it may have stopped on the full disk
                await self.system.postgres.resume()

        self._later(10, free)
        return "PostgreSQL's disk full for 10 s"

    # -- the Bot API --------------------------------------------------------------------

    async def _telegram_429(self) -> str | None:
        n = self.rng.randint(1, 10)
        self.system.telegram.rate_limit_next(n, retry_after=self.rng.choice([0.5, 1, 3]))
        return f"next {n} calls 429"

    async def _telegram_500(self) -> str | None:
        n = self.rng.randint(1, 5)
        for _ in range(n):
            self.system.telegram.fail_next(None, 500, "Internal Server Error")
        return f"next {n} calls 500"

    async def _telegram_timeout(self) -> str | None:
        pause = self.rng.uniform(5, 40)
        self.system.telegram.hold()
        self._later(pause, self._release_telegram)
        return f"no answer for {pause:.1f} s"

    async def _release_telegram(self) -> None:
        self.system.telegram.release()

    async def _telegram_slow(self) -> str | None:
        most, pause = self.rng.uniform(0.5, 3.0), self.rng.uniform(5, 30)
        self.system.telegram.delay_arrivals(most, seed=self.rng.randrange(2**32))
        self._later(pause, self._telegram_quick)
        return f"calls up to {most:.1f} s on the way, unevenly, for {pause:.1f} s"

    async def _telegram_quick(self) -> None:
        self.system.telegram.delay_arrivals(0)

    async def _telegram_502(self) -> str | None:
        n = self.rng.randint(1, 5)
        for _ in range(n):
            self.system.telegram.fail_next(None, 502, "Bad Gateway")
        return f"next {n} calls 502"
