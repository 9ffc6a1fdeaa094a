"""The chaos run's anon mode (COMFYVEIL_CHAOS_ANON=1): one backend behind a hidden service.

A private Anyone network on 127.0.0.1 (the suite's `PrivateAnyoneNetwork`: 3 authorities,
5 relays) and two anon clients run by the product's `ManagedAnon`: the GPU host's, which
publishes one fake ComfyUI as a persistent hidden service with client authorization, and
the bot host's, whose SOCKS socket the product is pointed at with `[anyone] socks`, the
way an operator who runs their own anon does (the client key is that daemon's, in its
ClientOnionAuthDir). Neither restarts by itself here: the faults below kill them with
SIGKILL and start them again after 1-10 s, on the same sockets and keys.

Safety: every anon process runs with the private network's DirAuthority lines,
TestingTorNetwork 1 and OutboundBindAddress 127.0.0.1, and the public network is
forbidden for this process and the product's (COMFYVEIL_ANYONE_FORBID_PUBLIC=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from comfyveil.anyone import errors, hidden, process
from comfyveil.anyone import network as network_mod
from comfyveil.comfy.client import ComfyClient
from tests.chaos.faults import WEIGHTS, Faults
from tests.fixtures.anyone import ANON_DIR, PrivateAnyoneNetwork

if TYPE_CHECKING:
    from tests.chaos.system import Gpu, System

ENV = "COMFYVEIL_CHAOS_ANON"
BOOTSTRAP_S = 240.0  # 2 cores shared with other work: anon's first minute is CPU-bound
REACHABLE_S = 300.0
MID_JOB_WAIT_S = 10.0  # how long a kill waits for a job on the hidden GPU


def wanted() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


class ChaosAnon:
    """The private network, the GPU host's anon and the bot host's anon."""

    def __init__(self, root: Path) -> None:
        if ANON_DIR is None:
            raise SystemExit(
                f"{ENV}=1 needs the anon binary: set COMFYVEIL_ANON_DIR or run"
                " `comfyveil anon install --dir .venv/anon`"
            )
        os.environ[network_mod.FORBID_PUBLIC_ENV] = "1"
        self.root = root
        self.net = PrivateAnyoneNetwork(ANON_DIR, root / "net")
        self.host: process.ManagedAnon | None = None  # publishes the hidden service
        self.client: process.ManagedAnon | None = None  # the product's traffic goes through
        self.address = ""
        self.gpu: Gpu | None = None
        self.killed_mid_prompt = 0  # kills while the hidden GPU was running a prompt
        self.hit_jobs: set[str] = set()  # jobs running on the hidden GPU at a kill

    async def start(self, gpu: Gpu) -> str:
        """Publish `gpu` as a hidden service; returns the [anyone] lines that point the
        product at the bot host's anon (the backend's URL is then `url()`)."""
        started = time.monotonic()
        self.gpu = gpu
        await self.net.start()
        assert self.net.network is not None
        spec = hidden.HiddenServiceSpec(self.root / "hs", f"127.0.0.1:{gpu.fake.port}")
        bot_key = hidden.add_client(spec.directory, "bot")
        self.host = process.ManagedAnon(
            network=self.net.network,
            binary=self.net.binary,
            data_dir=self.root / "gpu-host",
            hidden_services=[spec],
            bootstrap_timeout=BOOTSTRAP_S,
            supervise=False,
        )
        await self.host.start()
        self.address = self.host.address_of(spec)
        service_id, _ = hidden.split_address(self.address)
        key_file = self.root / "keys" / "bot.auth_private"
        hidden.write_client_key_file(key_file, service_id, bot_key)
        self.client = process.ManagedAnon(
            network=self.net.network,
            binary=self.net.binary,
            data_dir=self.root / "client",
            client_keys=[key_file],
            bootstrap_timeout=BOOTSTRAP_S,
            supervise=False,
        )
        await self.client.start()
        await self._reachable(gpu)
        print(
            f"chaos: anon mode: {gpu.name} is http://{self.address} (a hidden service on a"
            f" private Anyone network, 10 anon processes), reachable after"
            f" {time.monotonic() - started:.0f} s",
            flush=True,
        )
        return f'[anyone]\nsocks = "unix:{self.client.socks_path}"\n'

    def url(self) -> str:
        return f"http://{self.address}"

    async def _reachable(self, gpu: Gpu) -> None:
        """The first request through a new hidden service can take a while (descriptor
        upload, introduction): wait for one before users come, not during their run."""
        assert self.client is not None
        deadline = time.monotonic() + REACHABLE_S
        while True:
            probe = ComfyClient(
                self.url(), name=gpu.name, timeout=30, proxy=self.client.socks_url("chaos-probe")
            )
            try:
                await probe.system_stats()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                with contextlib.suppress(errors.AnonError):
                    await self.client.new_identity()
                await asyncio.sleep(2)
            finally:
                await probe.aclose()

    def up(self, which: str) -> bool:
        """Whether that anon runs (not still coming back from an earlier kill)."""
        anon = self.client if which == "client" else self.host
        return anon is not None and anon.pid is not None and anon.ready

    async def kill(self, which: str) -> bool:
        """SIGKILL the bot host's ("client") or the GPU host's ("host") anon; False when
        it is already down (a fault before has not healed yet)."""
        if not self.up(which):
            return False
        anon = self.client if which == "client" else self.host
        assert anon is not None and anon.pid is not None
        os.kill(anon.pid, signal.SIGKILL)
        await anon.stop()  # reaps it and closes our control connection
        return True

    async def restart(self, which: str) -> None:
        """Start it again on the same sockets, keys and service address; a start that
        fails (a slow bootstrap) is tried again, as a service manager would."""
        anon = self.client if which == "client" else self.host
        assert anon is not None
        for _ in range(5):
            try:
                await anon.start()
                return
            except errors.AnonError as exc:
                print(f"chaos: anon {which} did not start again: {exc}", flush=True)
                await asyncio.sleep(5)

    async def outcomes(self, system: System) -> Counter[str]:
        """How the jobs that ran on the hidden GPU when an anon was killed ended (before
        retention purges them)."""
        assert self.gpu is not None
        ended: Counter[str] = Counter()
        if not self.hit_jobs:
            return ended
        rows = await system.query(
            "SELECT status, backend FROM jobs WHERE id::text = ANY(%s)", (list(self.hit_jobs),)
        )
        for row in rows:
            where = "there" if row["backend"] == self.gpu.name else "on another backend"
            ended[
                f"jobs running on {self.gpu.name} when an anon was killed: {row['status']} {where}"
            ] += 1
        return ended

    def notes(self) -> dict[str, int]:
        """What the run's figures say about the hidden GPU."""
        assert self.gpu is not None
        return {
            f"prompts run to completion on {self.gpu.name}, behind the hidden service": sum(
                self.gpu.all_executions().values()
            ),
            f"anon kills while {self.gpu.name} was running a prompt": self.killed_mid_prompt,
        }

    async def close(self) -> None:
        for anon in (self.client, self.host):
            if anon is not None:
                with contextlib.suppress(Exception):
                    await anon.close()
        await self.net.stop()


# Drawn only in the anon mode; the bot host's anon carries every job of that backend.
ANON_WEIGHTS = {"anon-client-sigkill": 3, "anon-host-sigkill": 2, "anon-both-sigkill": 1}


class AnonFaults(Faults):
    """The run's faults plus anon's: killed with SIGKILL, started again after 1-10 s."""

    def __init__(
        self, system: System, anon: ChaosAnon, rng: random.Random, *, every: tuple[float, float]
    ) -> None:
        super().__init__(system, rng, every=every)
        self.weights = {**WEIGHTS, **ANON_WEIGHTS}
        self.anon = anon

    async def _kill_anon(self, *which: str) -> str | None:
        gpu = self.anon.gpu
        assert gpu is not None
        if not any(self.anon.up(w) for w in which):
            return None
        # The kill that matters comes while the hidden GPU has a job of ours: wait a
        # little for one (at 1 request/s over three GPUs it is idle most of the time).
        deadline = time.monotonic() + MID_JOB_WAIT_S
        jobs = await self._jobs_on(gpu.name)
        while not jobs and gpu.fake.running is None and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            jobs = await self._jobs_on(gpu.name)
        running = gpu.fake.running.prompt_id if gpu.fake.running else None
        killed = [w for w in which if await self.anon.kill(w)]
        if not killed:
            return None
        self.anon.hit_jobs.update(str(j["id"]) for j in jobs)
        if running is not None:
            self.anon.killed_mid_prompt += 1
        pause = self.rng.uniform(1, 10)

        async def again() -> None:
            await asyncio.gather(*(self.anon.restart(w) for w in killed))

        self._later(pause, again)
        names = {"client": "the bot host's anon", "host": "the GPU host's anon"}
        who = " and ".join(names[w] for w in killed)
        return (
            f"{who} ({gpu.name} running prompt {running}, {len(jobs)} jobs of ours on it),"
            f" back after {pause:.1f} s"
        )

    async def _jobs_on(self, backend: str) -> list[dict[str, object]]:
        """Our jobs submitted to `backend` and not ended."""
        with contextlib.suppress(Exception):  # PostgreSQL may be down from another fault
            return await self.system.query(
                "SELECT id::text AS id FROM jobs WHERE status = 'running' AND backend = %s",
                (backend,),
            )
        return []

    async def _anon_client_sigkill(self) -> str | None:
        return await self._kill_anon("client")

    async def _anon_host_sigkill(self) -> str | None:
        return await self._kill_anon("host")

    async def _anon_both_sigkill(self) -> str | None:
        return await self._kill_anon("client", "host")
