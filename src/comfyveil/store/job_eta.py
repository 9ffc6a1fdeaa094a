"""The queue's ETA reads: a queued job's place, the measured durations of commands, and
what the user of a job waits for (`wait`, the one ETA every front end shows; the
estimate itself is store/eta.py's)."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, LiteralString

from comfyveil.comfy import routing
from comfyveil.store import errors, sql
from comfyveil.store import eta as eta_mod
from comfyveil.store.connector import Row
from comfyveil.store.job_reads import JobReads
from comfyveil.store.jobs import Status

DURATION_SAMPLES = 20  # recent successful runs averaged for an ETA (see command_durations)
ETA_RUNS = routing.RECENT  # recent runs of each command the ETA learns from: as the pool


def _number(value: Any) -> float | None:
    """A number from a progress or parameter field (JSON), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number > 0 else None


def _queued_eta(row: Row, parallel: int) -> float | None:
    """The ETA of a queued job from a `position_and_eta` row: the queue ahead shared out
    over `parallel` runners, plus its own run; None without measured runs of its command.
    A command ahead without measured runs counts as long as the job's own."""
    own = row["own_seconds"]
    if own is None:
        return None
    waiting = float(row["waiting_seconds"] or 0.0)
    return waiting / max(parallel, 1) + float(own)


class JobEta(JobReads):
    """Where a job stands in the queue and how long it has to wait."""

    async def running_remaining(self) -> float:
        """Seconds the running jobs still need, by measured runs of their commands (on
        their own backends where measured); what a queued job waits for beyond the queue."""
        row = await self.db.one("running_remaining")
        return float(row["seconds"]) if row is not None else 0.0

    async def position(self, job_id: uuid.UUID) -> int | None:
        """How many queued jobs will be claimed before this one (0: next); None if not queued."""
        row = await self.db.one("position_and_eta", job_id=job_id)
        return int(row["ahead"]) if row is not None and row["queued"] else None

    async def durations(
        self, commands: Iterable[str], backend: str | None = None
    ) -> dict[str, float]:
        """Mean seconds of recent successful runs per command (on `backend`, or any)."""
        rows = await self.db.all("command_durations", commands=list(commands), backend=backend)
        return {row["command"]: row["seconds"] for row in rows}

    async def eta(self, job_id: uuid.UUID, *, parallel: int = 1) -> float | None:
        """Seconds until the job should be done, from measured durations; None if unknown.

        Args:
            parallel: how many jobs run at once (free GPUs), to share out the queue ahead.
        """
        job = await self.get(job_id)
        if job is None or job.status.finished:
            return None
        if job.status is Status.RUNNING:
            own = await self.durations([job.command], job.backend)
            if job.command not in own:
                own = await self.durations([job.command])
            if job.command not in own:
                return None
            started = job.started_at or job.updated_at
            elapsed = (dt.datetime.now(dt.UTC) - started).total_seconds()
            return max(own[job.command] - elapsed, 0.0)
        row = await self.db.one("position_and_eta", job_id=job_id)
        if row is None or not row["queued"]:  # claimed meanwhile
            return await self.eta(job_id, parallel=parallel)
        return _queued_eta(row, parallel)

    async def wait(
        self,
        job_id: uuid.UUID,
        *,
        backends: Sequence[str] | None = None,
        slots: Mapping[str, int] | None = None,
        read: list[Row] | None = None,
    ) -> eta_mod.Wait | None:
        """What the user of a queued or running job waits for (store/eta.py): the one ETA
        every front end shows. None when the job is not there or has ended.

        Args:
            backends: the backends that can take jobs now (a GPU down is left out);
                None: those that ran recently, and those with jobs now.
            slots: how many jobs each holds at once (`eta.slots_of` the configured
                ones); one not named, or None: the default, one running and one waiting.
            read: the rows of query eta_state (`eta_query`) when the caller read them
                with its own reads of the job, in one round trip; None: read here.
        """
        if read is None:
            row = await self.db.one("eta_state", job_id=job_id, runs=ETA_RUNS)
        else:
            row = read[0] if read else None
        if row is None or row["status"] not in (Status.QUEUED.value, Status.RUNNING.value):
            return None
        on = elapsed = None
        if not row["queued"] and row["status"] == Status.RUNNING.value and row["backend"]:
            on = row["backend"]
            # Only a job ComfyUI has started runs there; one just claimed (no state yet),
            # waiting for the GPU, sent ("submitted": ComfyUI may queue it behind the
            # job running there) or queued on the backend waits behind that job.
            if row["state"] == "running":
                elapsed = max(0.0, float(row["elapsed"] or 0.0))
        ahead: list[eta_mod.Ahead] = []
        busy: list[eta_mod.Busy] = []
        for (
            command, allowed, backend, elapsed_there, state, size, done, steps, step_s,
            key, claimed_after_ours, plan,
        ) in row["busy"]:  # fmt: skip
            work = eta_mod.work_of(size)
            allowed = tuple(allowed) if allowed else None
            if backend is None or state == "waiting":  # claimed, waiting for a GPU: ahead
                if row["queued"]:
                    ahead.append(eta_mod.Ahead(command, allowed, work, key, plan))
                continue
            if on is not None and backend == on and claimed_after_ours:
                continue  # sent there after ours: it waits behind ours
            busy.append(
                eta_mod.Busy(
                    backend, command, elapsed_there, work,
                    _count(steps) or eta_mod.steps_of(size), _number(done), _number(step_s),
                )
            )
        ahead += [
            eta_mod.Ahead(
                command, tuple(allowed) if allowed else None, eta_mod.work_of(size), key, plan
            )
            for command, allowed, key, size, plan in row["ahead"]
        ]
        runs = eta_mod.runs_from(
            (b, c, start, end, eta_mod.work_of(size), _count(steps) or eta_mod.steps_of(size),
             _number(step_s), cold if isinstance(cold, bool) else None, _number(load))
            for b, c, start, end, size, steps, step_s, cold, load in row["runs"]
        )
        last = {run.backend: run.command for run in runs}
        names = list(backends) if backends is not None else list(dict.fromkeys(last))
        size = row["size"]
        found = eta_mod.estimate(
            eta_mod.estimator_from(runs),
            command=row["command"],
            backends=names,
            busy=busy,
            ahead=ahead,
            own_backends=tuple(row["backends"]) if row["backends"] else None,
            on=on,
            elapsed=elapsed,
            last_command=last,
            work=eta_mod.work_of(size),
            steps=_count(row["steps"]) or eta_mod.steps_of(size),
            done=_number(row["done"]) if elapsed is not None else None,
            step_s=_number(row["step_s"]) if elapsed is not None else None,
            behind=int(row["behind_count"]),
            slots=dict(slots) if slots else eta_mod.SLOTS,
            plan=row["plan"] if row["queued"] else None,
        )
        if not row["queued"]:  # only queued jobs have a place in the queue
            return eta_mod.Wait(found.seconds, 0, found.running, {}, found.backend)
        if found.backend is not None and found.seconds is not None and row["plan"] is None:
            # Where the first ETA placed it is where the pool sends it (unless the runs
            # stray far), and where every later job's ETA counts it: a close call of the
            # rule still to come moved them all by a model load when it was decided.
            # Best effort: an ETA read that cannot write (a backend name past the column's
            # bound, a database that stopped answering) still answers; the rule decides.
            with contextlib.suppress(errors.StoreError):
                await self.db.run("keep_plan", job_id=job_id, plan=found.backend)
        return eta_mod.Wait(
            found.seconds,
            int(row["ahead_count"]) + (len(ahead) - len(row["ahead"])),
            found.running,
            found.ahead_by_backend,
            found.backend,
            queued=True,
        )

    @staticmethod
    def eta_query(job_id: uuid.UUID) -> tuple[LiteralString, dict[str, Any]]:
        """Query eta_state and its values, for a caller that sends it with other reads
        (then hands its rows to `wait`)."""
        return sql.queries["eta_state"], {"job_id": job_id, "runs": ETA_RUNS}

    async def position_and_eta(
        self, job_id: uuid.UUID, *, parallel: int = 1
    ) -> tuple[int | None, float | None]:
        """`position` and `eta` of a queued job from one query (the queue is read once).

        A job no longer queued (claimed or ended meanwhile) has no position, and the ETA
        `eta` gives for it now.
        """
        row = await self.db.one("position_and_eta", job_id=job_id)
        if row is None or not row["queued"]:
            return None, await self.eta(job_id, parallel=parallel)
        return int(row["ahead"]), _queued_eta(row, parallel)
