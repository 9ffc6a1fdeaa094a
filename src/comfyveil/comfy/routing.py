"""How long a workflow takes on each backend, and what a model switch costs there.

The pool sends a job where it is expected to *finish* first: the work already queued on
a backend, plus a cold start when that GPU has other models loaded, plus the run itself.
This module keeps the numbers behind that guess, in the cost model the ETA uses too
(`comfy.costs`): a run costs a fixed part plus seconds per unit of the work a job asks
(sampler steps x megapixels x frames) for that workflow on that backend, the pace taken
from the progress events of the runs the pool placed (seconds per step) or from runs of
different sizes; a cold start adds the extra measured when ComfyUI ran the loaders (its
`execution_cached` did not list them), else the other backends' figure. A job running
still needs its steps left at the pace it has shown, so a long job that started earlier
is not taken for nearly done. Optionally seeded from a `comfyveil bench` results.json, so
a new pool routes well from its first job.

A backend with no estimate yet for a workflow counts as instant, so it is tried once and
measured instead of being avoided for ever.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comfyveil.comfy import costs, results, template

RECENT = 50  # runs of each workflow the model is fitted to: as many as the ETA reads
# A backend expected to finish a job first may hold this many times its slots; the bound
# keeps a wrong estimate from piling work onto one GPU.
OVERFLOW = 2
# A job keeps the backend its first ETA announced unless it would finish this share
# later there than where the rule sends it now (`keep_plan`).
STRAY = 0.25
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
    able: Iterable[Option],
    free: Iterable[Option],
    *,
    waited: float,
    behind: int = 0,
    planned: str | None = None,
) -> Option | None:
    """Where the "finish" rule sends a job now, or None to wait for a busy backend.

    The one rule both the pool (which places the job) and the ETA (which plays the queue
    forward to say when it will be done) follow, so an ETA counts each job ahead where it
    will really go. `able`: the backends that can run it; `free`: those of them with a
    free slot; `waited`: seconds the job has waited for a slot; `behind`: jobs waiting
    behind it; `planned`: the backend its first ETA announced (see `keep_plan`).
    """
    free, able = list(free), list(able)
    chosen = _rule(able, free, waited=waited, behind=behind)
    if planned is None or (chosen is not None and chosen.name == planned):
        return chosen
    plan = next((o for o in able if o.name == planned), None)
    if plan is None:
        return chosen
    if keep_plan(plan, chosen, free):
        return plan
    return None if waits_for_plan(plan, chosen, free, waited) else chosen


def keep_plan(plan: Option, chosen: Option | None, free: Sequence[Option]) -> bool:
    """Whether a job still goes to the backend its first ETA announced (`plan`) when the
    rule now picks `chosen` (None: wait for a busy one).

    The rule's close calls (a free GPU that loads other models, or the busy one that
    holds them) split a model load's worth of outcomes on runs a little shorter or
    longer; the ETA of every job behind swung with each such call still to come. Kept
    to its plan, a job lands where every ETA already counted it, unless the runs strayed
    far: there it would finish more than STRAY later than where the rule sends it now,
    or it has no room (it holds up to OVERFLOW times its slots, as the rule allows).
    """
    if not free or plan.load >= OVERFLOW * plan.capacity:
        return False
    best = chosen if chosen is not None else min(free, key=lambda o: o.order)
    return within_stray(plan.finish, best.finish)


def waits_for_plan(
    plan: Option, chosen: Option | None, free: Sequence[Option], waited: float
) -> bool:
    """Whether a job waits for its planned backend, full now (it holds all it may), rather
    than go where the rule sends it: while the job would still finish there within STRAY
    of the best, and for no longer than a run on the best free backend (the aging bound).
    Sent elsewhere, it took a slot that other planned jobs counted on, and those were
    sent away from their plans in turn."""
    if not free or plan.load < OVERFLOW * plan.capacity:
        return False
    best_free = min(free, key=lambda o: o.order)
    best = chosen if chosen is not None else best_free
    return within_stray(plan.finish, best.finish) and waited < best_free.finish


def within_stray(planned_finish: float, best_finish: float) -> bool:
    """Whether a job finishing `planned_finish` seconds from now on its planned backend
    is close enough to the best backend's `best_finish` to stay (STRAY)."""
    return planned_finish <= best_finish * (1.0 + STRAY)


def _rule(
    able: Sequence[Option], free: Sequence[Option], *, waited: float, behind: int
) -> Option | None:
    if not free:
        return None
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


@dataclass(frozen=True)
class Estimate:
    """What the pool expects of one workflow on one backend (for /backends, jobs show):
    a run of the size its recent runs asked for, and a cold start's extra."""

    backend: str
    workflow: str
    run: float | None
    cold_extra: float | None
    samples: int


class Estimator:
    """The pool's cost model (`costs.Model`), taught the runs the pool placed: what a job
    of a workflow costs on a backend for the work it asks, and what a switch adds there.
    The ETA fits the same model to the same runs as the database holds them."""

    def __init__(self) -> None:
        # per workflow, its latest runs with their order of finishing
        self._runs: dict[str, deque[tuple[int, costs.Run]]] = {}
        self._seq = 0
        self._model: costs.Model | None = costs.Model()

    @property
    def model(self) -> costs.Model:
        """The model fitted to the runs kept (refitted after a run was learnt)."""
        if self._model is None:
            ordered = sorted(itertools.chain.from_iterable(self._runs.values()))
            self._model = costs.estimator_from(run for _, run in ordered)
        return self._model

    def learn(
        self,
        backend: str,
        workflow: str,
        seconds: float,
        *,
        load: float | None = None,
        work: float = 1.0,
        steps: int | None = None,
        step_s: float | None = None,
    ) -> None:
        """One run of `work` took `seconds`, of which `load` went to loading models (None:
        its models were loaded); `steps` at `step_s` seconds each, when measured."""
        if not seconds >= 0 or (load is not None and not load >= 0):  # NaN, a confused clock
            return
        if not work > 0:
            work = 1.0
        run = costs.Run(
            backend, workflow, float(seconds), float(work), steps,
            step_s if step_s is not None and step_s > 0 else None,
            cold=load is not None, load=None if load is None else float(load),
        )  # fmt: skip
        self._seq += 1
        self._runs.setdefault(workflow, deque(maxlen=RECENT)).append((self._seq, run))
        self._model = None

    def cost(self, backend: str, workflow: str) -> costs.Cost | None:
        """A warm run's cost there (None: that GPU ran nothing yet: it gets tried)."""
        return self.model.cost(backend, workflow)

    def run_seconds(self, backend: str, workflow: str, work: float = 1.0) -> float | None:
        """A warm run of `work` on `backend`: measured there, else the median of the other
        backends' (a GPU that ran nothing yet has no estimate: it gets tried)."""
        return self.model.run_seconds(backend, workflow, work)

    def cold_seconds(self, backend: str, workflow: str) -> float:
        """The extra of a cold start: measured there, else on the other backends, else 0."""
        return self.model.cold_seconds(backend, workflow)

    def typical(self, backend: str) -> float | None:
        """A run of whatever workflow on `backend` (the median of its recent runs): for
        jobs there we know nothing of, not even the work they ask."""
        runs = [r.seconds for q in self._runs.values() for _, r in q if r.backend == backend]
        return statistics.median(runs) if runs else None

    def estimates(self, backend: str | None = None) -> list[Estimate]:
        found: dict[tuple[str, str], list[costs.Run]] = {}
        for runs in self._runs.values():
            for _, run in runs:
                if backend is None or run.backend == backend:
                    found.setdefault((run.backend, run.command), []).append(run)
        model = self.model
        return [
            Estimate(
                b,
                w,
                model.run_seconds(b, w, statistics.median(r.work for r in runs)),
                model.cold_measured(b, w),
                len(runs),
            )
            for (b, w), runs in sorted(found.items())
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
        works = {
            str(w.get("name")): costs.work_of(w.get("params"))
            for w in doc.get("workflows") or ()
            if isinstance(w, Mapping) and isinstance(w.get("params"), Mapping)
        }
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
            self.learn(backend or name, workflow, float(seconds), work=works.get(workflow, 1.0))
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


def measured(wf: template.Workflow, timings: results.Timings) -> dict[str, Any]:
    """What a finished run tells the ETA's cost model, kept with its job (`costs.Run`'s
    `cold` and `load`): whether it loaded models and the seconds its loaders took, as
    the pool learns them; empty when ComfyUI's timings of it are not known."""
    if timings.duration_ms is None:
        return {}
    load = load_seconds(wf, timings.cached_nodes, timings.node_ms)
    return {"cold": load is not None, "load_s": None if load is None else round(load, 3)}
