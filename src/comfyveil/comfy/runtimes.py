"""What the pool expects of the runs it places, and what it learns from them: the work
queued ahead of a job on a backend, a cold start there, a job's run time, and the
progress and timings of the runs that ended (see `routing` and `costs`, whose figures
and rule these are).

`RunTimes` is mixed into `pool.Pool`, which holds the backends and the estimator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from comfyveil import config
from comfyveil.comfy import costs, results, workflow
from comfyveil.comfy import routing as routing_mod

if TYPE_CHECKING:
    from comfyveil.comfy.pool import Backend, Placed, Slot

logger = logging.getLogger("comfyveil.comfy.pool")  # the name it logged under before the split


class RunTimes:
    """The run-time part of `pool.Pool` (which it is mixed into)."""

    estimator: routing_mod.Estimator
    _ended: dict[str, Placed]
    _configs: Sequence[config.BackendConfig]

    def expected_finish(
        self, backend: Backend, wf: workflow.Workflow, now: float, work: float = 1.0
    ) -> float:
        """Seconds until a job of `wf` asking `work` placed on `backend` now would be done."""
        return (
            self.backlog(backend, now)
            + self.cold_cost(backend, wf)
            + (self.estimator.run_seconds(backend.name, wf.name, work) or 0.0)
        )

    def backlog(self, backend: Backend, now: float) -> float:
        """Seconds of work on `backend` ahead of a job placed now: each job of ours there
        at what its work costs (a switch where it loads models), one that ComfyUI runs
        by what it still needs from its progress (as the ETA counts it)."""
        total = 0.0
        for placed in sorted(backend.placed.values(), key=lambda p: p.at):
            total += self.still_needs(backend.name, placed, now)
        unknown = backend.load - len(backend.placed)  # other pools' jobs, re-attached ones
        if unknown > 0:
            total += unknown * (self.estimator.typical(backend.name) or 0.0)
        return total

    def still_needs(self, name: str, placed: Placed, now: float) -> float:
        """Seconds a job of ours on backend `name` still needs."""
        cost = self.estimator.cost(name, placed.workflow)
        seconds = cost.seconds(placed.work) if cost is not None else 0.0
        if placed.cold:
            seconds += self.estimator.cold_seconds(name, placed.workflow)
        if placed.started is None:
            return seconds
        pace = placed.step_s
        if pace is None and cost is not None and placed.steps:
            pace = cost.rate * placed.work / placed.steps
        return costs.still_needs(
            seconds,
            max(0.0, now - placed.started),
            fixed=cost.fixed if cost is not None else 0.0,
            pace=pace,
            steps=placed.steps,
            done=placed.done,
        )

    def cold_cost(self, backend: Backend, wf: workflow.Workflow) -> float:
        """What loading `wf`'s models costs on `backend` before its run, given the work
        already placed there (0 when they will be loaded, or nothing was measured)."""
        needed = routing_mod.models(wf)
        if not needed or (backend.models_after is not None and needed <= backend.models_after):
            return 0.0
        return self.estimator.cold_seconds(backend.name, wf.name)

    def progress(
        self,
        slot: Slot,
        *,
        started: bool = False,
        done: float | None = None,
        steps: int | None = None,
        step_s: float | None = None,
    ) -> None:
        """What ComfyUI says of a job of ours: it `started` now, or `done` of its `steps`
        are done at `step_s` seconds a step. Its backend's backlog counts what it still
        needs from then on, and its run is learnt from its start."""
        placed = slot.backend.placed.get(slot.job_id) or self._ended.get(slot.job_id)
        if placed is None:
            return
        if started or placed.started is None:
            placed.started = time.monotonic()
        if done is not None:
            placed.done = float(done)
        if steps is not None and steps > 0:
            placed.steps = int(steps)
        if step_s is not None and step_s > 0:
            placed.step_s = float(step_s)

    def learn(self, slot: Slot, timings: results.Timings) -> None:
        """A job ran on `slot`'s backend: learn from ComfyUI's timings of it (its own
        start and end stamps, the nodes it took from its cache, each node's time) and
        from its progress: its seconds from ComfyUI's start to its result here, as the
        ETA counts a run."""
        placed = self._ended.pop(slot.job_id, None) or slot.backend.placed.get(slot.job_id)
        seconds_ms = timings.duration_ms
        if slot.workflow is None or seconds_ms is None:
            return
        wf = slot.workflow
        seconds = seconds_ms / 1000
        if placed is not None and placed.started is not None:
            seconds = max(seconds, time.monotonic() - placed.started)
        elif placed is not None and placed.alone and placed.ended is not None:
            # No start seen: what the job cost its GPU end to end (upload, submit, run)
            seconds = max(seconds, placed.ended - placed.at)
        load = routing_mod.load_seconds(wf, timings.cached_nodes, timings.node_ms)
        self.estimator.learn(
            slot.backend.name,
            wf.name,
            seconds,
            load=load,
            work=placed.work if placed is not None else slot.work,
            steps=placed.steps if placed is not None else None,
            step_s=placed.step_s if placed is not None else None,
        )

    def seed_estimates(self) -> None:
        """Read each backend's `bench` results.json, where configured."""
        for cfg in self._configs:
            path = getattr(cfg, "bench", None)
            if path is None:
                continue
            try:
                taken = self.estimator.seed_from_bench(Path(path), backend=cfg.name)
            except ValueError as exc:
                raise config.ConfigError(f"backend {cfg.name}: bench: {exc}") from None
            logger.info(
                "backend %s: %d benchmark runs seed its run-time estimates",
                cfg.name,
                taken,
                extra={"action": "estimates_seeded", "backend": cfg.name},
            )
