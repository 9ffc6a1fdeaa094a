"""How long until a job's result: one answer for the chat, the web page and `jobs show`.

The routing estimator (`comfy.routing.Estimator`: per backend and workflow, the median
of recent runs, and what a model switch adds there) is fed the recent successful runs
the database holds, oldest first; a run whose backend ran another command just before
is a cold start, its extra over that backend's warm runs the switch's cost. Then the
queue is played forward: each backend is busy for what its running jobs still need (a
job near or past its estimate still needs a tenth of it: never "0 s" while it runs) and
for the jobs waiting on it; each job ahead, in claim order, goes where it would finish
first, as the pool sends it; ours last. The answer says where the queue ahead goes,
backend by backend, the running jobs included.

The place in the queue moves forward only (`PlaceMemory`): round-robin may put another
user's job ahead of one already shown "#1"; the place shown stays the smallest shown so
far, as the docs promise states only move forward.
"""

from __future__ import annotations

import collections
import heapq
import statistics
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from comfyveil.comfy.routing import Estimator

OVERRUN_SHARE = 0.1  # of its estimate, what a job running (near or) past it still needs
SIMULATED = 64  # jobs ahead placed one by one; those beyond are spread evenly
CANDIDATES = 8  # backends soonest free a job ahead is weighed on (model switches differ)
UNKNOWN_BACKEND = "gpu"  # names anonymous runners when the caller knows only how many


@dataclass(frozen=True, slots=True)
class Run:
    """A finished successful run: where, what, how long (seconds), in order of finishing."""

    backend: str
    command: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Busy:
    """A job on a backend now: running for `elapsed` s, or waiting there (None)."""

    backend: str
    command: str
    elapsed: float | None


@dataclass(frozen=True, slots=True)
class Ahead:
    """A job that will be claimed before ours: its command and the backends it may use
    (None: any)."""

    command: str
    backends: tuple[str, ...] | None = None


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


def runs_from(spans: Iterable[tuple[str, str, float, float]]) -> list[Run]:
    """Runs from (backend, command, started, finished) spans (any clock, in seconds),
    oldest first. A job is started when claimed, and may then wait on its backend behind
    another (`max_waiting`): its run starts when the one before it there finished."""
    runs: list[Run] = []
    last_end: dict[str, float] = {}
    for backend, command, started, finished in sorted(spans, key=lambda s: s[3]):
        begun = max(started, last_end.get(backend, started))
        last_end[backend] = finished
        runs.append(Run(backend, command, max(0.0, finished - begun)))
    return runs


def estimator_from(runs: Iterable[Run]) -> Estimator:
    """The routing estimator, taught the runs (oldest first)."""
    estimator = Estimator()
    previous: dict[str, str] = {}
    cold: list[Run] = []
    unsure: list[Run] = []
    for run in runs:
        before = previous.get(run.backend)
        previous[run.backend] = run.command
        if before is None:
            unsure.append(run)  # what ran before it there is not known: warm or cold?
        elif before != run.command:
            cold.append(run)  # the models were switched: learnt once the warm runs are
        else:
            estimator.learn(run.backend, run.command, run.seconds)
    measured = {(e.backend, e.workflow) for e in estimator.estimates() if e.run is not None}
    for run in unsure:  # only where nothing surer was measured
        if (run.backend, run.command) not in measured:
            estimator.learn(run.backend, run.command, run.seconds)
    for run in cold:
        warm = estimator.run_seconds(run.backend, run.command)
        load = None if warm is None else max(0.0, run.seconds - warm)
        estimator.learn(run.backend, run.command, run.seconds, load=load)
    return estimator


def estimate(
    estimator: Estimator,
    *,
    command: str,
    backends: Sequence[str] | int,
    busy: Sequence[Busy] = (),
    ahead: Sequence[Ahead] = (),
    own_backends: tuple[str, ...] | None = None,
    elapsed: float | None = None,
    on: str | None = None,
    last_command: Mapping[str, str] | None = None,
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

    order = {b: i for i, b in enumerate(names)}
    table = _Table(estimator)
    warm: dict[tuple[str, str], float] = {}
    anywhere: dict[str, float | None] = {}

    def runs_of(cmd: str) -> float | None:
        if cmd not in anywhere:
            found = [s for b in names if (s := table.run(b, cmd)) is not None]
            anywhere[cmd] = min(found) if found else None
        return anywhere[cmd]

    def cost(backend: str, cmd: str) -> float:
        key = (backend, cmd)
        if key not in warm:
            warm[key] = table.run(backend, cmd) or runs_of(cmd) or table.typical(backend)
        seconds = warm[key]
        if loaded[backend] not in (None, cmd):
            seconds += table.cold(backend, cmd)
        return seconds

    free_at = dict.fromkeys(names, 0.0)
    loaded: dict[str, str | None] = {b: (last_command or {}).get(b) for b in names}
    running: collections.Counter[str] = collections.Counter()

    def take(backend: str, cmd: str, elapsed_s: float | None) -> None:
        seconds = cost(backend, cmd)
        if elapsed_s is not None:  # running: what it still needs, never nothing
            seconds = max(seconds - elapsed_s, seconds * OVERRUN_SHARE)
        free_at[backend] += seconds
        loaded[backend] = cmd
        heapq.heappush(free, (free_at[backend], order[backend], backend))

    # The backends by when they are free (stale entries skipped): a job ahead looks at
    # the CANDIDATES soonest free, not at every one of a large pool.
    free: list[tuple[float, int, str]] = [(0.0, i, b) for i, b in enumerate(names)]
    # Running first (they are the oldest on each backend), then those waiting there.
    for job in sorted(busy, key=lambda j: j.elapsed is None):
        running[job.backend] += 1
        take(job.backend, job.command, job.elapsed)

    def place(cmd: str, allowed: tuple[str, ...] | None) -> str:
        if allowed is not None:
            able = [b for b in names if b in allowed] or names
        else:
            able, seen = [], set()
            while free and len(able) < CANDIDATES:
                at, _, b = heapq.heappop(free)
                if at == free_at[b] and b not in seen:
                    seen.add(b)
                    able.append(b)
            for b in able:  # back in, as they were
                heapq.heappush(free, (free_at[b], order[b], b))
        return min(able, key=lambda b: (free_at[b] + cost(b, cmd), order[b]))

    where: collections.Counter[str] = collections.Counter()
    for job in ahead[:SIMULATED]:
        backend = place(job.command, job.backends)
        where[backend] += 1
        take(backend, job.command, None)
    if len(ahead) > SIMULATED:
        # Deep in a long queue, the rest ahead is spread evenly (warm runs): placing each
        # would cost more than the precision is worth to a wait of that length.
        rest = sum(runs_of(job.command) or 0.0 for job in ahead[SIMULATED:])
        for backend in names:
            free_at[backend] += rest / len(names)
            heapq.heappush(free, (free_at[backend], order[backend], backend))
    known = runs_of(command) is not None
    if on is not None and on in free_at and elapsed is not None:
        ours = on  # running: only what it still needs
        own = cost(on, command)
        total = max(own - elapsed, own * OVERRUN_SHARE)
    else:
        ours = on if on is not None and on in free_at else place(command, own_backends)
        take(ours, command, None)
        total = free_at[ours]
    return Wait(
        seconds=total if known else None,
        ahead=len(ahead),
        running=dict(running),
        ahead_by_backend=dict(where),
        backend=ours,
    )


class _Table:
    """The estimator's answers (`Estimator.run_seconds`, `cold_seconds`, `typical`, same
    rules) read from one pass over its estimates: a queue of hundreds of jobs on a pool
    of many backends asks them thousands of times."""

    def __init__(self, estimator: Estimator) -> None:
        self._run: dict[tuple[str, str], float] = {}
        self._cold: dict[tuple[str, str], float] = {}
        runs: dict[str, list[float]] = collections.defaultdict(list)
        colds: dict[str, list[float]] = collections.defaultdict(list)
        own: dict[str, list[float]] = collections.defaultdict(list)
        for e in estimator.estimates():
            if e.run is not None:
                self._run[(e.backend, e.workflow)] = e.run
                runs[e.workflow].append(e.run)
                own[e.backend].append(e.run)
            if e.cold_extra is not None:
                self._cold[(e.backend, e.workflow)] = e.cold_extra
                colds[e.workflow].append(e.cold_extra)
        self._ran = {e.backend for e in estimator.estimates()}
        self._others = {w: statistics.median(v) for w, v in runs.items()}
        self._cold_others = {w: statistics.median(v) for w, v in colds.items()}
        self._typical = {b: statistics.median(v) for b, v in own.items()}

    def run(self, backend: str, workflow: str) -> float | None:
        found = self._run.get((backend, workflow))
        if found is not None or backend not in self._ran:
            return found
        return self._others.get(workflow)

    def cold(self, backend: str, workflow: str) -> float:
        found = self._cold.get((backend, workflow))
        return found if found is not None else self._cold_others.get(workflow, 0.0)

    def typical(self, backend: str) -> float:
        return self._typical.get(backend, 0.0)


def backends_up(pool: Any, configured: Sequence[Any]) -> list[str] | None:
    """The backends that can take jobs now: the healthy ones of this process's pool
    (`comfy.pool.Pool`) when it runs one, else the configured ones (`BackendConfig`);
    None when neither is known (the ETA then takes those that ran recently)."""
    if pool is not None and getattr(pool, "backends", None):
        return [name for name, backend in pool.backends.items() if backend.healthy]
    return [backend.name for backend in configured] or None


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
