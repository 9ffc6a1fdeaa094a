"""How long until a job's result: one answer for the chat, the web page and `jobs show`.

What a run costs is the pool's own cost model (`comfy.costs`), taught the recent
successful runs the database holds: per backend and command, a fixed part plus seconds
per unit of the *work* a job asks (sampler steps times megapixels times frames,
`work_of`), and what a model switch adds there. A run counts from ComfyUI's start of the
prompt (`executing_at`), not from the claim.

Then the queue is played forward by the pool's own rule (`comfy.routing.choose`, the one
function the pool places jobs with): each backend is busy for what its running jobs still
need and for the jobs waiting on it, and holds `SLOTS` jobs at once; each job ahead, in
claim order, is sent when a backend it may use has a free slot, to the backend the rule
picks, and pays a model switch exactly where it lands on other models; ours last, its ETA
the end of its run there. Past `RULED` jobs ahead, a job goes where it would finish first
and pays a switch as often as runs lately did. The ETA is the mean of `SAMPLES` such
playbacks with every run a little longer or shorter than estimated (each job's draw the
same at every refresh), and of the estimate as it stands. A job waiting on its GPU
waits for the jobs sent there before it only.

A running job still needs its steps left at the pace it has shown, plus its tail (never
less than its steps left need); one past its estimate with no progress to go by is not
taken as nearly done: it is expected to run half as long again as it has. The answer
says where the queue ahead goes, backend by backend, the running jobs included.

The place in the queue moves forward only (`PlaceMemory`): round-robin may put another
user's job ahead of one already shown "#1"; the place shown stays the smallest shown so
far, as the docs promise states only move forward.
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import math
import random
import statistics
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from comfyveil.comfy import costs, routing

# The cost model is the pool's (comfy/costs.py): the names the ETA's callers use.
MEGAPIXEL = costs.MEGAPIXEL
OVERRUN_SHARE = costs.OVERRUN_SHARE
TAIL_SHARE = costs.TAIL_SHARE
Cost = costs.Cost
Model = costs.Model
Run = costs.Run
estimator_from = costs.estimator_from
fit = costs.fit
runs_from = costs.runs_from
steps_of = costs.steps_of
still_needs = costs.still_needs
work_of = costs.work_of

SIMULATED = 500  # jobs ahead placed one by one; those beyond are spread evenly
RULED = 32  # jobs ahead placed by the pool's rule; those beyond where they finish first
SLOTS = 2  # jobs a backend holds at once unless told: one running, one waiting (the default)
UNKNOWN_BACKEND = "gpu"  # names anonymous runners when the caller knows only how many
SAMPLES = 16  # playbacks with the runs a little sooner or later done (8 past RULED ahead)
RUN_SPREAD = 0.15  # how far a run's length strays from its estimate, a share of it
_NORMAL = statistics.NormalDist()


@dataclass(frozen=True, slots=True)
class Busy:
    """A job on a backend now: running for `elapsed` s (since ComfyUI started it), or
    waiting there (None); its work, its steps, the steps done and a step's seconds so far
    (from its progress events, None before any)."""

    backend: str
    command: str
    elapsed: float | None
    work: float = 1.0
    steps: int | None = None
    done: float | None = None
    step_s: float | None = None


@dataclass(frozen=True, slots=True)
class Ahead:
    """A job that will be claimed before ours: its command and the backends it may use
    (None: any), and its work."""

    command: str
    backends: tuple[str, ...] | None = None
    work: float = 1.0
    key: str | None = None  # the job's id: its run drawn alike at every refresh
    plan: str | None = None  # the backend its first ETA announced (`routing.keep_plan`)


@dataclass(frozen=True, slots=True)
class Draw:
    """One likely playback: the share of its estimate each run takes.

    `shares`: the jobs on each backend now, by backend. A job ahead with a `key` takes
    its own share, drawn from `seed` and its key (RUN_SPREAD wide, the sign of the draw
    flipped by `sign` for the antithetic twin), so one job's draw is the same at every
    refresh: two ETAs differ by what changed, not by the draw.
    """

    shares: Mapping[str, float]
    seed: str = ""
    sign: float = 1.0

    def job(self, key: str | None) -> float:
        if key is None or not self.seed:
            return 1.0
        digest = hashlib.blake2b(f"{self.seed}:{key}".encode(), digest_size=8).digest()
        z = _NORMAL.inv_cdf((int.from_bytes(digest, "big") + 0.5) / 2**64)
        return max(0.2, 1.0 + self.sign * RUN_SPREAD * z)


@dataclass(frozen=True)
class Wait:
    """What a user waits for.

    Attributes:
        seconds: until the result; None when nothing like it was measured yet.
        ahead: jobs to be claimed before this one (queued, or claimed and waiting for a
            GPU); 0 when it is not queued.
        running: the jobs on the backends now, per backend (running or waiting there).
        ahead_by_backend: where the jobs ahead are expected to run.
        backend: where this one is expected to run.
        queued: whether it waits in the queue (has a place).
    """

    seconds: float | None
    ahead: int = 0
    running: Mapping[str, int] = field(default_factory=dict)
    ahead_by_backend: Mapping[str, int] = field(default_factory=dict)
    backend: str | None = None
    queued: bool = False

    @property
    def place(self) -> int | None:
        """1 + the jobs ahead, for a queued job; None otherwise."""
        return self.ahead + 1 if self.queued else None


def estimate(
    estimator: Model,
    *,
    command: str,
    backends: Sequence[str] | int,
    busy: Sequence[Busy] = (),
    ahead: Sequence[Ahead] = (),
    own_backends: tuple[str, ...] | None = None,
    elapsed: float | None = None,
    on: str | None = None,
    last_command: Mapping[str, str] | None = None,
    work: float = 1.0,
    steps: int | None = None,
    done: float | None = None,
    step_s: float | None = None,
    slots: Mapping[str, int] | int = SLOTS,
    behind: int = 0,
    plan: str | None = None,
    spread: Mapping[str, float] | Draw | None = None,
) -> Wait:
    """Seconds until a job of `command` is done, with the queue ahead split by backend.

    Args:
        backends: the backends' names, or how many there are (then named gpu0, gpu1...;
            those of `busy` are added either way).
        busy: the other jobs on the backends now.
        ahead: the jobs to be claimed before ours, in claim order.
        own_backends: the backends ours may use (None: any).
        on: the backend ours is on (running, or waiting there behind `busy`);
        elapsed: for how long it has run there (None: it waits there).
        last_command: the command each backend ran last (its models are loaded).
        work, steps, done, step_s: what ours asks (`work_of`), its steps, and once it
            runs, the steps done and a step's seconds so far.
        slots: how many jobs each backend holds at once (one running, the rest waiting
            there), by name or for all.
        behind: the jobs queued behind ours (the pool's rule weighs them).
        plan: the backend ours was announced on, which the pool keeps to
            (`routing.keep_plan`); None: the one this estimate places it on, in every
            playback (it is then the plan to keep: `Wait.backend`).
        spread: what the runs take, as shares of their estimates (one playback of
            `likely_spreads`; a mapping: the jobs on each backend now, by backend);
            None: the mean over those playbacks.
    """
    names = (
        [f"{UNKNOWN_BACKEND}{i}" for i in range(backends)]
        if isinstance(backends, int)
        else list(backends)
    )
    for job in busy:
        if job.backend not in names:
            names.append(job.backend)
    if not names:
        return Wait(None, ahead=len(ahead))
    if spread is None:
        args = dict(
            command=command, backends=names, busy=busy, ahead=ahead,
            own_backends=own_backends, elapsed=elapsed, on=on, last_command=last_command,
            work=work, steps=steps, done=done, step_s=step_s, slots=slots, behind=behind,
            plan=plan,
        )  # fmt: skip
        base = estimate(estimator, **args, spread={})
        if base.seconds is None or on is not None or len(names) < 2 or not (busy or ahead):
            return base
        # Ours goes where this estimate announces it in every playback, as the pool keeps
        # it there: a mean over playbacks that split it between two GPUs moved by half a
        # model load when the pool chose.
        args["plan"] = plan or base.backend
        # Which GPU frees a slot first decides where the jobs ahead land, and so ours;
        # the runs end a little sooner or later than estimated: the ETA is the mean over
        # those likely orders, not one of them (one flipped as runs went on).
        samples = SAMPLES if len(ahead) <= RULED else SAMPLES // 2
        found = [
            estimate(estimator, **args, spread=draw).seconds
            for draw in likely_spreads(names, samples)
        ]
        mean = statistics.fmean([base.seconds, *(f for f in found if f is not None)])
        return replace(base, seconds=mean)
    draw = spread if isinstance(spread, Draw) else Draw(spread)

    costs: dict[tuple[str, str], Cost | None] = {}
    anywhere: dict[str, Cost | None] = {}

    def cost_of(backend: str, cmd: str) -> Cost | None:
        key = (backend, cmd)
        if key not in costs:
            found = estimator.cost(backend, cmd)
            if found is None:
                if cmd not in anywhere:
                    anywhere[cmd] = estimator.anywhere(names, cmd)
                found = anywhere[cmd]
            costs[key] = found
        return costs[key]

    def run(backend: str, cmd: str, units: float) -> float:
        found = cost_of(backend, cmd)
        return found.seconds(units) if found is not None else estimator.typical(backend, units)

    colds: dict[tuple[str, str], float] = {}

    def switch(backend: str, cmd: str) -> float:
        """What loading `cmd`'s models costs there after the work placed there so far."""
        if loaded[backend] in (None, cmd):
            return 0.0
        key = (backend, cmd)
        if key not in colds:
            colds[key] = estimator.cold_seconds(backend, cmd)
        return colds[key]

    def pace_of(
        backend: str, cmd: str, units: float, n: int | None, measured: float | None
    ) -> float | None:
        if measured is not None:
            return measured
        found = cost_of(backend, cmd)
        if found is None or not n:
            return None
        return found.rate * units / n

    def left(backend: str, cmd: str, units: float, seconds: float, job: Busy) -> float:
        found = cost_of(backend, cmd)
        return still_needs(
            seconds,
            job.elapsed or 0.0,
            fixed=found.fixed if found is not None else 0.0,
            pace=pace_of(backend, cmd, units, job.steps, job.step_s),
            steps=job.steps,
            done=job.done,
        )

    loaded: dict[str, str | None] = {b: (last_command or {}).get(b) for b in names}
    # Ours, running, loaded its models or not against the run before it there, not
    # against a job waiting behind it.
    held_before = dict(loaded)
    # When each job on a backend will be done, in the order it runs them (one at a time).
    ends: dict[str, list[float]] = {b: [] for b in names}
    running: collections.Counter[str] = collections.Counter()

    def put(backend: str, cmd: str, seconds: float, at: float = 0.0) -> float:
        queue = ends[backend]
        finish = max(at, queue[-1] if queue else 0.0) + seconds
        queue.append(finish)
        loaded[backend] = cmd
        return finish

    # Running first (they are the oldest on each backend), then those waiting there.
    for job in sorted(busy, key=lambda j: j.elapsed is None):
        running[job.backend] += 1
        seconds = run(job.backend, job.command, job.work) + switch(job.backend, job.command)
        if job.elapsed is not None:  # running: what it still needs
            seconds = left(job.backend, job.command, job.work, seconds, job)
        put(job.backend, job.command, seconds * draw.shares.get(job.backend, 1.0))

    capacity = {b: max(1, slots if isinstance(slots, int) else slots.get(b, SLOTS)) for b in names}

    # Each job ahead is placed by the pool's rule, as the slots free in this playback.
    # Deep in the queue, where a slot frees first and which models it holds by then hang
    # on every run before it ending a little sooner or later; one playback swung by whole
    # model loads as jobs were sent, the mean over the likely ones does not (and follows
    # the pool's batching of a workflow's jobs onto the GPUs that hold its models, which
    # a switch counted as often as runs lately did overstated by 15-20 %). Past RULED
    # jobs ahead, where a job would finish first is close enough, and cheaper.
    depth = RULED
    guessed = dict.fromkeys(names, False)  # a deep job was placed there
    rank = {b: i for i, b in enumerate(names)}

    def place(
        cmd: str,
        units: float,
        allowed: tuple[str, ...] | None,
        at: float,
        after: int,
        deep: bool = False,
        planned: str | None = None,
    ) -> tuple[str, float, float]:
        """Where the pool sends a job that asks for a slot at `at` with `after` jobs
        behind it, by its own rule (`routing.choose`): the backend, when it is sent,
        when it is done. A `deep` one (behind more jobs than the backends hold at once)
        is placed as the slots free then cannot be known yet (see below)."""
        able = [b for b in names if allowed is None or b in allowed] or names
        if deep:
            # Deep in the queue, which backend frees a slot first and which models it
            # holds by then depend on every landing before: the job goes where it would
            # finish first, a switch counted as often as runs lately did.
            def expected(b: str) -> float:
                extra = switch(b, cmd)
                if extra > 0 or guessed[b]:
                    extra = estimator.switch_share * estimator.cold_seconds(b, cmd)
                return extra + run(b, cmd, units)

            costs_there = {b: expected(b) for b in able}

            def finish(b: str) -> float:  # from `at`, as the pool's rule weighs it
                return max(0.0, (ends[b][-1] if ends[b] else 0.0) - at) + costs_there[b]

            name = min(able, key=lambda b: (finish(b), rank[b]))
            if (
                planned is not None
                and planned in costs_there
                and routing.within_stray(finish(planned), finish(name))
            ):
                name = planned
            guessed[name] = True
            return name, at, put(name, cmd, costs_there[name], at)
        # The pool sends a job when a backend it can use has a free slot.
        t = max(at, min(_slot_free(ends[b], capacity[b], at) for b in able))
        aged = False  # its wait reached the aging bound (then the rule always sends it)
        while True:
            options: list[routing.Option] = []
            free: list[routing.Option] = []
            for b in able:
                queue = ends[b]
                load = len(queue) - bisect.bisect_right(queue, t)
                extra = switch(b, cmd)
                option = routing.Option(
                    b,
                    max(0.0, (queue[-1] if queue else 0.0) - t) + extra + run(b, cmd, units),
                    load,
                    capacity[b],
                    extra > 0,
                )
                options.append(option)
                if load < option.capacity:
                    free.append(option)
            waited = math.inf if aged else t - at
            chosen = routing.choose(options, free, waited=waited, behind=after, planned=planned)
            if chosen is not None:
                break
            # It waits for a busy backend: until a job ends somewhere, or as long as a
            # run on the best free one would take (then the pool starts it there).
            best_free = min(free, key=lambda o: o.order)
            later = [
                queue[i]
                for b in able
                if (i := bisect.bisect_right(queue := ends[b], t)) < len(queue)
            ]
            upcoming = min([*later, at + best_free.finish])
            # Only the aging bound left, and due: t - at can fall short of it by a
            # rounding, and the playback waited on the spot for ever.
            aged = upcoming <= t
            t = max(t, upcoming)
        seconds = switch(chosen.name, cmd) + run(chosen.name, cmd, units)
        return chosen.name, t, put(chosen.name, cmd, seconds, t)

    where: collections.Counter[str] = collections.Counter()
    sent = 0.0  # the pool sends the jobs one after another, in claim order
    for index, job in enumerate(ahead[:SIMULATED]):
        after = len(ahead) - index  # those behind it, ours included
        units = job.work * draw.job(job.key)
        backend, sent, _ = place(
            job.command, units, job.backends, sent, after, deep=index >= depth, planned=job.plan
        )
        where[backend] += 1
    if len(ahead) > SIMULATED:
        # Deep in a long queue, the rest ahead is spread evenly (warm runs): placing each
        # would cost more than the precision is worth to a wait of that length.
        rest = 0.0
        for job in ahead[SIMULATED:]:
            found = cost_of(names[0], job.command)
            rest += found.seconds(job.work) if found is not None else 0.0
        for backend in names:
            put(backend, loaded[backend] or "", rest / len(names), sent)
        sent = min(queue[-1] for queue in ends.values())
    known = any(cost_of(b, command) is not None for b in names)
    if on is not None and on in ends and elapsed is not None:
        ours = on  # running: only what it still needs
        extra = 0.0 if held_before[on] in (None, command) else estimator.cold_seconds(on, command)
        total = left(
            on,
            command,
            work,
            run(on, command, work) + extra,
            Busy(on, command, elapsed, work, steps, done, step_s),
        )
    elif on is not None and on in ends:
        ours = on  # waiting there: after the jobs on it now, not after those still queued
        total = put(on, command, switch(on, command) + run(on, command, work))
    else:
        ours, _, total = place(
            command, work, own_backends, sent, behind, deep=len(ahead) >= depth, planned=plan
        )
    return Wait(
        seconds=total if known else None,
        ahead=len(ahead),
        running=dict(running),
        ahead_by_backend=dict(where),
        backend=ours,
    )


def likely_spreads(names: Iterable[str], samples: int = SAMPLES) -> list[Draw]:
    """`samples` likely playbacks in antithetic pairs: the shares of their estimates the
    jobs on each backend now take, and each job ahead (RUN_SPREAD apart on average), the
    same for a backend or a job at every refresh: one ETA shown after another differ by
    what changed, not by the draw."""
    names = list(names)
    draws: list[Draw] = []
    for k in range(samples // 2):
        z = {b: random.Random(f"{k}:{b}").gauss(0.0, 1.0) for b in names}
        for sign in (1.0, -1.0):
            shares = {b: max(0.2, 1.0 + sign * RUN_SPREAD * z[b]) for b in names}
            draws.append(Draw(shares, seed=str(k), sign=sign))
    return draws


def _slot_free(queue: Sequence[float], capacity: int, at: float) -> float:
    """When a backend whose jobs end at `queue` (ascending) has a free slot, from `at`."""
    pending = len(queue) - bisect.bisect_right(queue, at)
    return at if pending < capacity else queue[len(queue) - capacity]


def backends_up(pool: Any, configured: Sequence[Any]) -> list[str] | None:
    """The backends that can take jobs now: the healthy ones of this process's pool
    (`comfy.pool.Pool`) when it runs one, else the configured ones (`BackendConfig`);
    None when neither is known (the ETA then takes those that ran recently)."""
    if pool is not None and getattr(pool, "backends", None):
        return [name for name, backend in pool.backends.items() if backend.healthy]
    return [backend.name for backend in configured] or None


def slots_of(configured: Sequence[Any]) -> dict[str, int]:
    """How many jobs each configured backend (`BackendConfig`) holds at once, as the pool
    counts them: the one running plus `max_waiting` waiting there."""
    return {backend.name: 1 + max(0, int(backend.max_waiting)) for backend in configured}


class EtaMemory:
    """What was last shown of each job's ETA, so that it does not jump back up.

    A new estimate later than the last one shown (counted down since) by more than
    RISE is shown as that much later only: the next looks bring it the rest of the way
    if it holds, and it never climbs by more than a fifth at once. Sooner is shown at
    once. Per process, for the most recent `size` jobs.
    """

    RISE = 1.2

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._shown: collections.OrderedDict[uuid.UUID, tuple[float, float]] = (
            collections.OrderedDict()
        )

    def seconds(self, job_id: uuid.UUID, seconds: float | None, now: float) -> float | None:
        """The ETA to show at `now` (monotonic seconds) for the estimate `seconds`."""
        if seconds is None:
            return None
        before = self._shown.get(job_id)
        if before is not None:
            at, shown = before
            left = shown - (now - at)
            if left > 0:
                seconds = min(seconds, left * self.RISE)
        self._shown[job_id] = (now, seconds)
        self._shown.move_to_end(job_id)
        while len(self._shown) > self._size:
            self._shown.popitem(last=False)
        return seconds


class PlaceMemory:
    """The smallest place in the queue shown for each job, so that it never goes back.

    Kept per process, for the most recent `size` jobs (a status message, a web page
    refreshing itself); a place never shown before is shown as it is.
    """

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._shown: collections.OrderedDict[uuid.UUID, int] = collections.OrderedDict()

    def place(self, job_id: uuid.UUID, place: int) -> int:
        shown = min(place, self._shown.get(job_id, place))
        self._shown[job_id] = shown
        self._shown.move_to_end(job_id)
        while len(self._shown) > self._size:
            self._shown.popitem(last=False)
        return shown

    def forget(self, job_id: uuid.UUID) -> None:
        self._shown.pop(job_id, None)
