"""The pool of ComfyUI backends: who is up, what each can run, and who has a free slot.

Every configured backend (one ComfyUI, usually one GPU) is probed in a side task (see
`health`): a backend that fails a probe or a job is marked down and probed again with
exponential backoff. What the pool expects of each run and learns from it lives in
`runtimes`; this module holds the backends and hands out their slots.

A backend holds at most one running job plus ``max_waiting`` queued ones (default 1), so
its GPU starts the next job the moment one ends. `acquire` waits for such a slot on a
backend that can run the workflow; when every backend is down it waits (the caller tells
the user "waiting for a GPU"); when the backends that are up all lack something the
workflow needs it fails at once with `NoBackendCanRun` ("no GPU has the model file
flux1-dev.safetensors").

Which backend: with ``routing="finish"`` (the default) the one where the job is expected
to finish first: the work queued there ahead of it, plus a cold start when that GPU last
ran other models, plus its run time there, each counted from the work a job asks (steps,
size, frames) at that GPU's learnt pace, a running job from its steps left (see `routing`
and `costs`: the ETA plays the queue forward with the same figures and rule). Waiting for
a fast, warm GPU can beat starting at once on a slow or cold one: when no other job waits
behind it, such a job is queued on that GPU beyond its usual slots (up to `OVERFLOW`
times them); past that bound it waits at most as long as a run on the best free backend
would take. With jobs waiting behind it, it takes the free backend where it finishes
first: a GPU left idle while work waits costs more than one job's choice gains (late
binding, as under load).
``routing="idle"`` is the older rule (an idle backend first, whichever it is), kept as the
benchmark baseline.

Slots are counted per pool (one per worker process); jobs other pools put on a backend
show up in its probed queue length, so several workers share backends without piling
more than a little extra work onto one GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from comfyveil import config
from comfyveil import tasks as background
from comfyveil.comfy import costs, errors, workflow
from comfyveil.comfy import limits as comfy_limits
from comfyveil.comfy import routing as routing_mod
from comfyveil.comfy.health import PROBE_INTERVAL, BackendClient, ModelMemory, Probing
from comfyveil.comfy.runtimes import RunTimes
from comfyveil.i18n import N_

ROUTINGS = ("finish", "idle")
OVERFLOW = routing_mod.OVERFLOW  # with routing "finish": see `routing.choose`

_MISSING = re.compile(r"^(model file|node type) (?P<what>.+?)(?: \([^)]*\))? is not installed$")


class NoBackendCanRun(errors.ComfyError):
    """No GPU can run this workflow."""

    transient = False


ProxyFor = Callable[[config.BackendConfig], "str | None"]
ClientFactory = Callable[[config.BackendConfig, "str | None"], BackendClient]
# Told when a backend starts failing, e.g. to renew anon's circuits before the next try.
OnDown = Callable[[config.BackendConfig], Awaitable[None]]


def direct(backend: config.BackendConfig) -> str | None:
    """The default proxy hook: connect to every backend directly."""
    return None


def _default_client(
    backend: config.BackendConfig, proxy: str | None, limits: comfy_limits.Limits | None = None
) -> BackendClient:
    from comfyveil.comfy import client as comfy_client

    return comfy_client.ComfyClient(backend.url, name=backend.name, proxy=proxy, limits=limits)


@dataclass(eq=False)
class Backend:
    """One backend as the pool sees it."""

    config: config.BackendConfig
    client: Any
    healthy: bool = False
    object_info: Mapping[str, Any] | None = None
    capabilities_at: float = 0.0  # monotonic time of the last /object_info read
    # object_info is the one kept from an earlier run (this run has not read it yet)
    remembered: bool = False
    kept: Mapping[str, Any] | None = field(default=None, repr=False)  # last handed to memory
    failures: int = 0
    downs: int = 0  # times marked down: a probe begun before the last one cannot undo it
    # The probe on its way, which every other caller joins (`Probing.probe`).
    probing: asyncio.Future[bool] | None = field(default=None, repr=False, compare=False)
    next_probe: float = 0.0
    remote_queue: int = 0  # running + pending at the last probe
    local_at_probe: int = 0  # of which were ours
    remote_ids: set[str] | None = None  # the prompt ids seen at the last probe, if named
    jobs: set[str] = field(default_factory=set)  # job ids this pool put there
    released: set[str] = field(default_factory=set)  # ours that left since the last probe
    last_error: str | None = None
    placed: dict[str, Placed] = field(default_factory=dict)  # ours, with what we expect
    # The model files loaded once the work we placed there has run (None: not known).
    models_after: frozenset[tuple[str, str]] | None = None
    # workflow hash -> (the object_info it was checked against, its problems there)
    _checked: dict[str, tuple[Mapping[str, Any], list[str]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def capacity(self) -> int:
        return 1 + max(0, self.config.max_waiting)

    @property
    def load(self) -> int:
        """Jobs on the backend: ours now plus the others' seen at the last probe.

        When the probe named the prompts, a job of ours that ended after the probe does
        not count as someone else's, so its slot is free the moment it is released, not
        at the next probe.
        """
        if self.remote_ids is not None:
            foreign = len(self.remote_ids - self.jobs - self.released)
        else:
            foreign = max(0, self.remote_queue - self.local_at_probe)
        return len(self.jobs) + foreign

    @property
    def free_slots(self) -> int:
        return max(0, self.capacity - self.load) if self.healthy else 0

    @property
    def free(self) -> bool:
        return self.healthy and self.load < self.capacity

    def problems(self, wf: workflow.Workflow) -> list[str]:
        """What stops this backend from running `wf` (empty: it can)."""
        info = self.object_info
        if info is None:
            return ["its nodes and models are not known yet"]
        # Asked several times per job; the answer changes only with a new /object_info.
        cached = self._checked.get(wf.hash)
        if cached is None or cached[0] is not info:
            cached = (info, wf.check(info))
            self._checked[wf.hash] = cached
        return list(cached[1])


@dataclass
class Placed:
    """A job of ours on a backend: which workflow, the work it asks, when it was placed,
    whether it loads models first; once ComfyUI runs it, since when and its progress."""

    workflow: str
    work: float
    steps: int | None
    at: float  # monotonic
    alone: bool  # nothing else was on the backend: from here to its release is its cost
    cold: bool = False
    started: float | None = None  # monotonic, when ComfyUI started it
    done: float | None = None  # steps done
    step_s: float | None = None  # a step's seconds so far
    ended: float | None = None  # monotonic, when its slot was given back


@dataclass(frozen=True)
class Slot:
    """A place for one job on one backend; give it back with `Pool.release`."""

    backend: Backend
    job_id: str
    workflow: workflow.Workflow | None = None
    cold: bool = False  # expected to load models first
    expected: float | None = None  # seconds from placing to the end of its run
    work: float = 1.0  # what it asks (`costs.work_of`)


class Pool(Probing, RunTimes):
    """The configured backends, probed in the background.

    Use as ``async with Pool(settings.backend_list()) as pool:``; `start` opens a client
    per backend, probes each once and starts the health side task.
    """

    def __init__(
        self,
        backends: Sequence[config.BackendConfig],
        *,
        proxy_for: ProxyFor = direct,
        client_factory: ClientFactory | None = None,
        probe_interval: float = PROBE_INTERVAL,
        on_down: OnDown | None = None,
        limits: comfy_limits.Limits | None = None,
        routing: str = "finish",
        estimator: routing_mod.Estimator | None = None,
        memory: ModelMemory | None = None,
    ) -> None:
        if not backends:
            raise config.ConfigError("no backends configured")
        if routing not in ROUTINGS:
            raise config.ConfigError(f"routing must be one of {', '.join(ROUTINGS)}")
        self.routing = routing
        self.estimator = estimator or routing_mod.Estimator()
        self._ended: dict[str, Placed] = {}  # job id -> its place, its slot given back
        self._configs = tuple(backends)
        self._proxy_for = proxy_for
        self._on_down = on_down
        # `limits`: what one job may bring back from a backend ([limits] in the config).
        self._client_factory = client_factory or functools.partial(_default_client, limits=limits)
        self.probe_interval = probe_interval
        self._memory = memory
        self.backends: dict[str, Backend] = {}
        self._stack = contextlib.AsyncExitStack()
        self._changed = asyncio.Condition()
        self._health_task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Pool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self.seed_estimates()
        for cfg in self._configs:
            client = self._client_factory(cfg, self._proxy_for(cfg))
            opened = await self._stack.enter_async_context(client)  # type: ignore[arg-type]
            self.backends[cfg.name] = Backend(cfg, opened if opened is not None else client)
        await asyncio.gather(*(self.probe(b) for b in self.backends.values()))
        await self._recall()
        self._health_task = asyncio.create_task(self._health_loop(), name="pool-health")

    async def close(self) -> None:
        if self._health_task is not None:
            await background.cancel_and_wait([self._health_task])
            self._health_task = None
        # A probe outlives the callers that were waiting on it (they share it, shielded).
        await background.cancel_and_wait(
            b.probing for b in self.backends.values() if b.probing is not None
        )
        await self._stack.aclose()

    # --- state -------------------------------------------------------------------

    def get(self, name: str) -> Backend | None:
        return self.backends.get(name)

    @property
    def any_healthy(self) -> bool:
        return any(b.healthy for b in self.backends.values())

    def free_backends(self) -> list[str]:
        """Names of the backends that can take one more job now."""
        return [b.name for b in self.backends.values() if b.free]

    def free_slots(self) -> dict[str, int]:
        """How many more jobs each backend with room can take now (by name)."""
        return {b.name: b.free_slots for b in self.backends.values() if b.free_slots > 0}

    def candidates(self, wf: workflow.Workflow) -> list[Backend]:
        """Healthy backends able to run `wf`, the least loaded (idle) first."""
        able = [b for b in self.backends.values() if b.healthy and not b.problems(wf)]
        return sorted(able, key=lambda b: (b.load, b.failures, b.name))

    def why_not(self, wf: workflow.Workflow) -> str | None:
        """Why no backend can run `wf`, or None when one can or none is known.

        The sentence names what every known backend lacks, e.g. "no GPU has the model
        file flux1-dev.safetensors".
        """
        # Down ones count by their last lists too (kept from an earlier run if need be):
        # a job no GPU could run once back is refused now, not after waiting for one.
        known = [b for b in self.backends.values() if b.object_info is not None]
        if not known or any(not b.problems(wf) for b in known):
            return None
        per_backend = [b.problems(wf) for b in known]
        common = [p for p in per_backend[0] if all(p in other for other in per_backend[1:])]
        sentences = []
        for problem in common:
            match = _MISSING.match(problem)
            if match:
                sentences.append(f"no GPU has the {match.group(1)} {match['what']}")
        if sentences:
            return "; ".join(sentences)
        first = per_backend[0][0]
        return f"no GPU can run this workflow: {first}"

    # --- slots -------------------------------------------------------------------

    async def acquire(
        self,
        wf: workflow.Workflow,
        job_id: str,
        *,
        on_wait: Callable[[str], Awaitable[None]] | None = None,
        avoid: str | None = None,
        behind: int = 0,
        params: Mapping[str, Any] | None = None,
        planned: str | None = None,
    ) -> Slot:
        """Wait for a free slot on a backend that can run `wf` and take it.

        `on_wait` is called once with a plain sentence ("waiting for a GPU") when the job
        has to wait. `avoid` names a backend to use only when no other one can take it.
        `behind` says how many jobs wait behind this one: then it takes the free backend
        where it finishes first rather than wait for a busy one (that would hold them up,
        and leave a GPU idle while work waits). `params`: the job's values, whose steps
        and size say how much work it asks. `planned`: the backend the job's first ETA
        announced; it goes there unless the runs strayed far (`routing.keep_plan`).

        Raises:
            NoBackendCanRun: backends are up but none has what `wf` needs.
        """
        told = False
        since = time.monotonic()
        work, steps = costs.work_of(params), costs.steps_of(params)
        if planned == avoid:
            planned = None  # it failed there: the plan is void
        if self.why_not(wf) is not None:
            await self.refresh_models()
        async with self._changed:
            while True:
                reason = self.why_not(wf)
                if reason is not None:
                    raise NoBackendCanRun(reason)
                able = self.candidates(wf)
                free = [b for b in able if b.free]
                if avoid is not None and len(free) > 1:
                    free = [b for b in free if b.name != avoid] or free
                backend = self._choose(
                    wf,
                    able,
                    free,
                    waited=time.monotonic() - since,
                    behind=behind,
                    work=work,
                    planned=planned,
                )
                if backend is not None:
                    return self._place(backend, wf, job_id, work, steps)
                if on_wait is not None and not told:
                    told = True
                    # stored in English; the chat says it in the job's language
                    await on_wait(
                        N_("waiting for a GPU") if not able else N_("waiting for a free GPU")
                    )
                with contextlib.suppress(TimeoutError):
                    await background.wait_for(self._changed.wait(), self.probe_interval)

    def _choose(
        self,
        wf: workflow.Workflow,
        able: list[Backend],
        free: list[Backend],
        *,
        waited: float,
        behind: int = 0,
        work: float = 1.0,
        planned: str | None = None,
    ) -> Backend | None:
        """The backend to take now, or None to wait for a busy one (or any)."""
        if not free:
            return None
        if self.routing == "idle":
            return free[0]
        now = time.monotonic()
        options = {
            b.name: routing_mod.Option(
                b.name,
                self.expected_finish(b, wf, now, work),
                b.load,
                b.capacity,
                self.cold_cost(b, wf) > 0,
                b.failures,
            )
            for b in able
        }
        chosen = routing_mod.choose(
            options.values(),
            (options[b.name] for b in free),
            waited=waited,
            behind=behind,
            planned=planned,
        )
        return None if chosen is None else self.backends[chosen.name]

    def _place(
        self,
        backend: Backend,
        wf: workflow.Workflow,
        job_id: str,
        work: float = 1.0,
        steps: int | None = None,
    ) -> Slot:
        now = time.monotonic()
        needed = routing_mod.models(wf)
        cold = bool(needed) and not (
            backend.models_after is not None and needed <= backend.models_after
        )
        seconds = (self.estimator.run_seconds(backend.name, wf.name, work) or 0.0) + (
            self.cold_cost(backend, wf)
        )
        expected = self.backlog(backend, now) + seconds
        alone = backend.load == 0
        backend.jobs.add(job_id)
        backend.placed[job_id] = Placed(wf.name, work, steps, now, alone, cold=cold)
        if needed:
            backend.models_after = needed
        return Slot(backend, job_id, wf, cold, expected, work)

    def take(self, name: str, job_id: str) -> Slot | None:
        """Hold a slot on backend `name` for a job already there (re-attaching after a
        crash), even past capacity: the job is on that GPU whatever we count."""
        backend = self.backends.get(name)
        if backend is None:
            return None
        backend.jobs.add(job_id)
        return Slot(backend, job_id)

    async def release(self, slot: Slot) -> None:
        """Give the slot back and wake every waiter at once (no probe needed)."""
        placed = slot.backend.placed.pop(slot.job_id, None)
        if placed is not None and slot.workflow is not None:
            placed.ended = time.monotonic()
            self._ended[slot.job_id] = placed  # its run is learnt once its result is in
            while len(self._ended) > 1000:  # slots whose runs were never learnt from
                self._ended.pop(next(iter(self._ended)))
        if slot.job_id in slot.backend.jobs:
            slot.backend.jobs.discard(slot.job_id)
            slot.backend.released.add(slot.job_id)
        await self._notify()

    @contextlib.asynccontextmanager
    async def slot(self, wf: workflow.Workflow, job_id: str, **kwargs: Any) -> AsyncIterator[Slot]:
        held = await self.acquire(wf, job_id, **kwargs)
        try:
            yield held
        finally:
            await self.release(held)

    async def wait_for_change(self, seconds: float) -> None:
        """Return when a slot frees or a backend's state changes, or after `seconds`."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await background.wait_for(self._changed.wait(), seconds)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
