"""What a run costs on a backend: one model for the pool that places jobs and the ETA
that says when they will be done.

A job's *work* is what it asks of the GPU: sampler steps times megapixels times frames
(`work_of`). A run on a backend is a fixed part (loaders, encoders, the decoder) plus
seconds per unit of work for that command there; the sampler's pace comes from ComfyUI's
progress events (the worker measures seconds per step, `step_s`), else from runs of
different sizes (the median of the slopes between them), else in proportion to the work.
A run that found other models loaded is a cold start (ComfyUI says so when its loaders
ran; else a run after another command on that backend is taken for one): its extra over
the warm prediction is what a model switch costs there. A job running still needs its
steps left at the pace it has shown, plus its tail (`still_needs`).

The pool (`comfy.runtimes`, through `routing.Estimator`) learns it from the runs it placed;
the ETA (`store.eta`) from the runs the database holds; both weigh a job by the same
figures, so the ETA's playback of the queue sends each job where the pool will.
"""

from __future__ import annotations

import collections
import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

OVERRUN_SHARE = 0.5  # of what it ran so far, what a job past its estimate still needs
TAIL_SHARE = 1.0  # of a run's fixed part, what comes after the sampler: with the models
# loaded (a switch is counted apart), what is left is mostly decoding, saving and sending
WINDOW = 15  # recent warm runs per backend and command a cost is fitted to
MEGAPIXEL = 1024 * 1024


def work_of(params: Mapping[str, Any] | None) -> float:
    """What a job asks of the GPU, in sampler steps x megapixels x frames x batch: what a
    run's sampler time grows with. A parameter a workflow lacks counts as 1."""
    params = params or {}

    def number(name: str) -> float | None:
        value = params.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            return None
        return float(value)

    steps = number("steps") or 1.0
    width, height = number("width"), number("height")
    if width is not None and height is not None:
        megapixels = width * height / MEGAPIXEL
    else:
        megapixels = number("megapixels") or 1.0
    frames = number("length") or number("frames") or 1.0
    batch = number("batch_size") or 1.0
    return steps * megapixels * frames * batch


def steps_of(params: Mapping[str, Any] | None) -> int | None:
    value = (params or {}).get("steps")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return int(value)


@dataclass(frozen=True, slots=True)
class Run:
    """A finished successful run: where, what, how long (seconds), in order of finishing;
    its work (`work_of`), its steps and, when the worker measured it, a step's seconds."""

    backend: str
    command: str
    seconds: float
    work: float = 1.0
    steps: int | None = None
    step_s: float | None = None
    # Whether it loaded models first, when ComfyUI said so (its loaders ran, or came from
    # its cache), and the seconds the loaders took; None: not known (taken from what ran
    # there before it).
    cold: bool | None = None
    load: float | None = None


def runs_from(spans: Iterable[Sequence[Any]]) -> list[Run]:
    """Runs from (backend, command, started, finished[, work, steps, step_s, cold, load])
    spans (any clock, in seconds), oldest first; `cold` and `load` as the worker measured
    them (`routing.measured`), None when not known. A run may have waited on its backend
    behind another (`max_waiting`) when its start is not ComfyUI's own: it starts, at the
    latest, when the one before it there finished."""
    runs: list[Run] = []
    last_end: dict[str, float] = {}
    for span in sorted(spans, key=lambda s: s[3]):
        backend, command, started, finished = span[0], span[1], span[2], span[3]
        work = float(span[4]) if len(span) > 4 and span[4] else 1.0
        steps = int(span[5]) if len(span) > 5 and span[5] else None
        step_s = float(span[6]) if len(span) > 6 and span[6] else None
        cold = span[7] if len(span) > 7 else None
        load = max(0.0, float(span[8])) if cold and len(span) > 8 and span[8] is not None else None
        begun = max(started, last_end.get(backend, started))
        last_end[backend] = finished
        runs.append(
            Run(backend, command, max(0.0, finished - begun), work, steps, step_s, cold, load)
        )
    return runs


@dataclass(frozen=True, slots=True)
class Cost:
    """A run's seconds: `fixed` plus `rate` per unit of work."""

    fixed: float
    rate: float

    def seconds(self, work: float) -> float:
        return self.fixed + self.rate * work


def fit(runs: Sequence[Run], paces: Sequence[float] = ()) -> Cost:
    """A command's cost on one backend from its warm runs (any order).

    Runs with a measured step: the sampler's share is its steps at that pace, the rest is
    fixed. `paces`: seconds per unit of work the sampler showed in runs there, cold ones
    included (their models loaded before the sampler started, so its pace is as good);
    by default those of `runs`. Otherwise runs of different sizes: the median of the
    slopes between them (one odd run moves it little), the fixed part what is left. One
    size only: in proportion.
    """
    paced = [r for r in runs if r.step_s is not None and r.steps]
    rates = list(paces) or [r.step_s * r.steps / r.work for r in paced]  # type: ignore[operator]
    if rates and runs:
        rate = statistics.median(rates)
        fixed = statistics.median(max(0.0, r.seconds - rate * r.work) for r in paced or runs)
        return Cost(fixed, rate)
    slopes = [
        (b.seconds - a.seconds) / (b.work - a.work)
        for a, b in itertools.combinations(runs, 2)
        if abs(b.work - a.work) > 1e-9 * max(a.work, b.work)
    ]
    if slopes:
        rate = max(0.0, statistics.median(slopes))
        fixed = statistics.median(r.seconds - rate * r.work for r in runs)
        if fixed >= 0.0:
            return Cost(fixed, rate)
    return Cost(0.0, statistics.median(r.seconds / r.work for r in runs))


class Model:
    """What runs cost, per backend and command, and what a model switch adds there."""

    def __init__(self) -> None:
        self._warm: dict[tuple[str, str], list[Run]] = collections.defaultdict(list)
        self._costs: dict[tuple[str, str], Cost] = {}
        self._cold: dict[tuple[str, str], float] = {}
        self._cold_others: dict[str, float] = {}
        self._cold_any = 0.0  # a switch's median extra over the commands measured
        self._others: dict[str, list[Cost]] = {}
        self._ran: set[str] = set()
        self._followed = self._switched = 0  # runs after another there; of them switches

    @property
    def switch_share(self) -> float:
        """How often a run lately found other models loaded (0 before any is known)."""
        return self._switched / self._followed if self._followed else 0.0

    def learn(self, runs: Iterable[Run]) -> None:
        """Learn the runs (oldest first)."""
        previous: dict[str, str] = {}
        cold: list[Run] = []
        unsure: list[Run] = []
        # The sampler's pace in every run that measured it, cold or warm: a pair's first
        # warm run alone set it before, and one odd one (steps read late) tripled it.
        paces: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        for run in runs:
            if run.step_s is not None and run.steps and run.work > 0:
                paces[(run.backend, run.command)].append(run.step_s * run.steps / run.work)
            before = previous.get(run.backend)
            previous[run.backend] = run.command
            self._ran.add(run.backend)
            switched = (
                run.cold
                if run.cold is not None
                else (None if before is None else before != run.command)
            )
            if before is not None or run.cold is not None:
                self._followed += 1
                self._switched += bool(switched)
            if switched is None:
                unsure.append(run)  # what ran before it there is not known: warm or cold?
            elif switched:
                cold.append(run)  # the models were switched: weighed once the warm are fit
            else:
                self._warm[(run.backend, run.command)].append(run)
        self._costs = {
            key: fit(runs[-WINDOW:], paces.get(key, [])[-WINDOW:])
            for key, runs in self._warm.items()
            if runs
        }
        extras: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        for run in cold:
            key = (run.backend, run.command)
            if key in self._costs:
                extras[key].append(max(0.0, run.seconds - self._costs[key].seconds(run.work)))
            elif run.load is not None:
                extras[key].append(run.load)  # no warm run yet: what ComfyUI timed
        self._cold = {key: statistics.median(v[-WINDOW:]) for key, v in extras.items()}
        by_command: dict[str, list[float]] = collections.defaultdict(list)
        for (_, command), extra in self._cold.items():
            by_command[command].append(extra)
        switch = {c: statistics.median(v) for c, v in by_command.items()}
        # Where no warm run was measured, the first runs (most likely cold: a backend's
        # first run loads its models) and the cold ones are all there is: what a switch
        # costs elsewhere comes off them, since a cold start adds it again.
        # A command whose switch was never measured loads its models as the others do:
        # until one of its runs is seen warm, a load counted in every run of it made each
        # ETA seconds too long, then fall by all of them at once.
        self._cold_any = statistics.median(switch.values()) if switch else 0.0
        guess: dict[tuple[str, str], list[Run]] = collections.defaultdict(list)
        for run in (*unsure, *cold):
            key = (run.backend, run.command)
            if key not in self._costs:
                load = (
                    run.load
                    if run.cold and run.load is not None
                    else (
                        0.0
                        if run.cold is False
                        else min(switch.get(run.command, self._cold_any), run.seconds * 0.9)
                    )
                )
                guess[key].append(replace(run, seconds=run.seconds - load))
        self._costs.update(
            {key: fit(runs[-WINDOW:], paces.get(key, [])[-WINDOW:]) for key, runs in guess.items()}
        )
        self._others: dict[str, list[Cost]] = collections.defaultdict(list)
        for (_, command), cost in self._costs.items():
            self._others[command].append(cost)
        self._cold_others = switch

    def cost(self, backend: str, command: str) -> Cost | None:
        """The cost there: measured there, else the median of the other backends' (a
        backend that ran nothing yet has none: the pool tries it)."""
        found = self._costs.get((backend, command))
        if found is not None or backend not in self._ran:
            return found
        others = self._others.get(command)
        if not others:
            return None
        return Cost(
            statistics.median(c.fixed for c in others), statistics.median(c.rate for c in others)
        )

    def run_seconds(self, backend: str, command: str, work: float = 1.0) -> float | None:
        """A warm run of `work` there (see `cost`)."""
        cost = self.cost(backend, command)
        return None if cost is None else cost.seconds(work)

    def cold_seconds(self, backend: str, command: str) -> float:
        """The extra of a cold start: measured there, else on the other backends, else
        what a switch to another command costs, else 0."""
        found = self._cold.get((backend, command))
        return found if found is not None else self._cold_others.get(command, self._cold_any)

    def cold_measured(self, backend: str, command: str) -> float | None:
        """A cold start's extra as measured there (None: none seen there yet)."""
        return self._cold.get((backend, command))

    def typical(self, backend: str, work: float = 1.0) -> float:
        """A run of whatever command there: for jobs there we know nothing of."""
        own = [c.seconds(work) for (b, _), c in self._costs.items() if b == backend]
        return statistics.median(own) if own else 0.0

    def anywhere(self, names: Iterable[str], command: str) -> Cost | None:
        """The cheapest backend's cost of `command` among `names`."""
        found = [c for b in names if (c := self.cost(b, command)) is not None]
        return min(found, key=lambda c: c.seconds(1.0)) if found else None


def estimator_from(runs: Iterable[Run]) -> Model:
    """The cost model, taught the runs (oldest first)."""
    model = Model()
    model.learn(runs)
    return model


def still_needs(
    cost: float,
    elapsed: float,
    *,
    fixed: float,
    pace: float | None,
    steps: int | None,
    done: float | None,
) -> float:
    """Seconds a job running for `elapsed` s still needs, its run expected to take `cost`.

    With progress (`done` of `steps` at `pace` seconds a step): the steps left at that
    pace and the tail after the sampler. Without: what its estimate leaves, or, past
    its estimate, half as long again as it ran. Never less than its steps left need.
    """
    left_steps = None
    if steps is not None:
        left_steps = max(0.0, steps - (done or 0.0))
    floor = left_steps * pace if left_steps is not None and pace is not None else 0.0
    if done is not None and left_steps is not None and pace is not None:
        return floor + fixed * TAIL_SHARE
    if elapsed < cost:
        return max(cost - elapsed, floor)
    return max(elapsed * OVERRUN_SHARE, floor)
