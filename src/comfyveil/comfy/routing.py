"""How long a workflow takes on each backend, and what a model switch costs there.

The pool sends a job where it is expected to *finish* first: the work already queued on
a backend, plus a cold start when that GPU has other models loaded, plus the run itself.
This module keeps the numbers behind that guess:

- run times per (backend, workflow), from ComfyUI's own execution timestamps (the
  `execution_start` and `execution_success` messages, as `comfyveil bench` reads them),
  a median of the recent runs so one stalled or lucky run does not move it much;
- the extra a cold start costs there: the time spent in the model loaders of runs whose
  loaders ComfyUI did not take from its cache (`execution_cached`), i.e. the first run
  after a switch; a backend that never had one borrows the other backends' figure;
- optionally seeded from a `comfyveil bench` results.json, so a new pool routes well from
  its first job.

A backend with no estimate yet for a workflow counts as instant, so it is tried once and
measured instead of being avoided for ever.
"""

from __future__ import annotations

import json
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comfyveil.comfy import template

WINDOW = 15  # runs kept per (backend, workflow) and kind: recent enough to follow a change
# A backend expected to finish a job first may hold this many times its slots; the bound
# keeps a wrong estimate from piling work onto one GPU.
OVERFLOW = 2
_MAX_SEED_FILE = 64 * 1024 * 1024  # a results.json of thousands of runs is a few MB


@dataclass(frozen=True, slots=True)
class Option:
    """A backend that can run the job, as the "finish" rule weighs it.

    Attributes:
        name: the backend.
        finish: seconds until the job would be done if placed there now (the work ahead
            of it there, a model switch, its run).
        load: jobs on it now; capacity: how many it holds (one running plus waiting).
        cold: whether it would load other models first.
        failures: its recent failures (a tie goes to the one with fewer).
    """

    name: str
    finish: float
    load: int
    capacity: int
    cold: bool
    failures: int = 0

    @property
    def order(self) -> tuple[float, int, int, str]:
        return (self.finish, self.load, self.failures, self.name)


def choose(
    able: Iterable[Option], free: Iterable[Option], *, waited: float, behind: int = 0
) -> Option | None:
    """Where the "finish" rule sends a job now, or None to wait for a busy backend.

    The one rule both the pool (which places the job) and the ETA (which plays the queue
    forward to say when it will be done) follow, so an ETA counts each job ahead where it
    will really go. `able`: the backends that can run it; `free`: those of them with a
    free slot; `waited`: seconds the job has waited for a slot; `behind`: jobs waiting
    behind it.
    """
    free = list(free)
    if not free:
        return None
    able = list(able)
    best_free = min(free, key=lambda o: o.order)
    best = min(able, key=lambda o: o.order)
    if best is best_free or best_free.finish <= best.finish:
        return best_free
    if behind > 0:
        # Jobs wait behind this one: a GPU left idle while work waits costs more than
        # this job gains by waiting, unless the free GPUs would all load other models
        # first (a switch costs every job behind too): then a GPU that has this
        # workflow's models loaded takes it into its queue.
        if not best_free.cold:
            return best_free
        warm = [
            o
            for o in able
            if o.load >= o.capacity and o.load < OVERFLOW * o.capacity and not o.cold
        ]
        if not warm:
            return best_free
        nearest = min(warm, key=lambda o: o.order)
        return nearest if nearest.finish < best_free.finish else best_free
    # A busy GPU where the job still finishes first takes it into its own queue, past
    # its usual slots (up to OVERFLOW times them): the job waits there, not here, and
    # the jobs behind it go on to the other GPUs instead of waiting behind it.
    if best.load < OVERFLOW * best.capacity:
        return best
    # Waiting here pays only while it is shorter than a run on the free GPU would
    # take: past that the job starts where it can (the aging bound).
    if waited >= best_free.finish:
        return best_free
    return None


@dataclass
class RunTimes:
    """Recent runs of one workflow on one backend, in seconds."""

    warm: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # runs, loads left out
    loads: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # cold starts' loads

    @property
    def run(self) -> float | None:
        """Seconds of a run with the models loaded."""
        return statistics.median(self.warm) if self.warm else None

    @property
    def cold_extra(self) -> float | None:
        """Seconds loading the models adds to a run, once a cold start was seen."""
        return statistics.median(self.loads) if self.loads else None


@dataclass(frozen=True)
class Estimate:
    """What the pool expects of one workflow on one backend (for /backends, jobs show)."""

    backend: str
    workflow: str
    run: float | None
    cold_extra: float | None
    samples: int


class Estimator:
    """Run-time estimates per backend and workflow (keyed by the workflow's name)."""

    def __init__(self) -> None:
        self._times: dict[tuple[str, str], RunTimes] = {}

    def learn(
        self, backend: str, workflow: str, seconds: float, *, load: float | None = None
    ) -> None:
        """One run took `seconds`, of which `load` went to loading models (None: warm)."""
        if not seconds >= 0 or (load is not None and not load >= 0):  # NaN, a confused clock
            return
        times = self._times.setdefault((backend, workflow), RunTimes())
        if load is None:
            times.warm.append(float(seconds))
            return
        times.loads.append(float(load))
        times.warm.append(max(0.0, float(seconds) - load))

    def run_seconds(self, backend: str, workflow: str) -> float | None:
        """A warm run of `workflow` on `backend`: measured there, else the median of the
        other backends' (a GPU that ran nothing yet has no estimate: it gets tried)."""
        times = self._times.get((backend, workflow))
        if times is not None and times.run is not None:
            return times.run
        if not any(b == backend for b, _ in self._times):
            return None
        others = [t.run for (_, w), t in self._times.items() if w == workflow and t.run is not None]
        return statistics.median(others) if others else None

    def cold_seconds(self, backend: str, workflow: str) -> float:
        """The extra of a cold start: measured there, else on the other backends, else 0."""
        times = self._times.get((backend, workflow))
        if times is not None and times.cold_extra is not None:
            return times.cold_extra
        others = [
            t.cold_extra
            for (_, w), t in self._times.items()
            if w == workflow and t.cold_extra is not None
        ]
        return statistics.median(others) if others else 0.0

    def typical(self, backend: str) -> float | None:
        """A run of whatever workflow on `backend`: for jobs there we know nothing of."""
        runs = [t.run for (b, _), t in self._times.items() if b == backend and t.run is not None]
        return statistics.median(runs) if runs else None

    def estimates(self, backend: str | None = None) -> list[Estimate]:
        return [
            Estimate(b, w, t.run, t.cold_extra, len(t.warm))
            for (b, w), t in sorted(self._times.items())
            if backend is None or b == backend
        ]

    def seed_from_bench(self, path: Path, *, backend: str | None = None) -> int:
        """Take the successful runs of a `comfyveil bench` results.json as warm runs.

        `backend` names the pool's backend the file measured; None keeps the file's
        names. Returns how many runs were taken.

        Raises:
            ValueError: the file is not a results.json this version understands.
        """
        try:
            with path.open("rb") as handle:
                raw = handle.read(_MAX_SEED_FILE + 1)
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
        if len(raw) > _MAX_SEED_FILE:
            raise ValueError(f"{path} is larger than {_MAX_SEED_FILE // (1024 * 1024)} MiB")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise ValueError(f"{path} is not JSON") from None
        if not isinstance(doc, Mapping) or doc.get("schema_version") != 1:
            raise ValueError(f"{path} is not a comfyveil bench results.json (schema 1)")
        taken = 0
        for record in _records(doc.get("records")):
            seconds = record.get("execution_s")
            name, workflow = record.get("backend"), record.get("workflow")
            if not (record.get("ok") is True and isinstance(seconds, int | float)):
                continue
            if record.get("cached_nodes") and not record.get("nodes"):
                continue  # answered from ComfyUI's cache (an older bench kept it): not a run
            if not isinstance(name, str) or not isinstance(workflow, str):
                continue
            self.learn(backend or name, workflow, float(seconds))
            taken += 1
        return taken


def _records(value: Any) -> Iterable[Mapping[str, Any]]:
    if not isinstance(value, list):
        return ()
    return (r for r in value if isinstance(r, Mapping))


def loader_nodes(wf: template.Workflow) -> frozenset[str]:
    """Node ids of `wf` that load a model file."""
    return wf.loader_nodes()


def models(wf: template.Workflow) -> frozenset[tuple[str, str]]:
    """The model files `wf` keeps in memory while it runs."""
    return frozenset(wf.required_models())


def ran_cold(wf: template.Workflow, cached_nodes: Iterable[str]) -> bool:
    """Whether a run had to load models: a loader of `wf` did not come from the cache."""
    return bool(loader_nodes(wf) - set(cached_nodes))


def load_seconds(
    wf: template.Workflow, cached_nodes: Iterable[str], node_ms: Mapping[str, float]
) -> float | None:
    """Seconds a run spent in the loaders it had to execute; None when it loaded nothing."""
    loaded = loader_nodes(wf) - set(cached_nodes)
    if not loaded:
        return None
    return sum(node_ms.get(node, 0.0) for node in loaded) / 1000.0
