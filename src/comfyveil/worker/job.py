"""Running one claimed job: placing it on a backend (or re-attaching to the prompt a backend
already has), executing it, turning the outcome into a final write, and saving its
progress and acting on cancel requests on the way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import mimetypes
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import events, execute, notrace, pool, workflow
from comfyveil.errors import UsageError
from comfyveil.store import errors as store_errors
from comfyveil.store import jobs, previews
from comfyveil.store.traces import JobTraces
from comfyveil.worker.options import (
    DB_RETRY_DELAY,
    MAX_ORPHANS,
    OFFLINE_CHECK,
    PROGRESS_INTERVAL,
    PROGRESS_SETTLE,
    WITHDRAW_TIMEOUT,
)

logger = logging.getLogger("comfyveil.worker")  # the name it logged under before the split


PREVIEW_INTERVAL = 0.25  # seconds between two preview writes of one job


@dataclass(eq=False)
class Running:
    job: jobs.Job
    task: asyncio.Task[None] | None = None
    placed: asyncio.Event = field(default_factory=asyncio.Event)  # has a slot, or waits
    waiting: bool = False  # waits in the pool for a free GPU
    slot: pool.Slot | None = None
    cancel_requested: bool = False
    cancelling: bool = False
    # The final status is being written (or was): no more lease renewals or progress
    # writes. A renewal or progress write landing after that write finds the job no longer
    # running; it must not read that as a lost lease and cancel the delivery that follows.
    settled: bool = False
    progress_at: float = field(default_factory=time.monotonic)  # the last write (or claim)
    progress_due: float = math.inf  # when progress_next is written
    progress_sooner: asyncio.Event = field(default_factory=asyncio.Event)  # due moved earlier
    progress_next: dict[str, Any] | None = None  # the newest progress not yet written
    progress_task: asyncio.Task[None] | None = None
    progress_closed: bool = False  # the job left the backend: no more progress writes
    # When ComfyUI started the prompt (monotonic; None before): "running" counts from it.
    executing_since: float | None = None
    # The sampler's first progress tick seen (node, value, monotonic time): its pace so far
    # tells the ETA what the steps left still need.
    steps_from: tuple[str | None, float, float] | None = None
    # What the job left on its backend (no trace), removed once its final status is
    # written: until then a successor can still fetch its images.
    cleanup: list[execute.Cleanup] = field(default_factory=list)
    cleanup_on: pool.Backend | None = None
    # The backend's newest preview frame not yet written (mime, bytes), for a client that
    # asked to see partial images; None for `previews_wanted` until it has been asked.
    preview_next: tuple[str, bytes] | None = None
    previews_wanted: bool | None = None
    preview_task: asyncio.Task[None] | None = None


class _Patient:
    """A job's trace log whose strike-outs wait a while for a database that restarts:
    the backend is clean by then, and its record should say so."""

    def __init__(self, log: notrace.TraceLog, lease_seconds: float) -> None:
        self.log = log
        self.seconds = lease_seconds * 10  # as long as a final status waits for it

    async def left(self, backend: str, traces: Sequence[notrace.Trace]) -> None:
        await self.log.left(backend, traces)

    async def gone(self, backend: str, traces: Sequence[notrace.Trace]) -> None:
        deadline = time.monotonic() + self.seconds
        while True:
            try:
                return await self.log.gone(backend, traces)
            except store_errors.DatabaseUnreachable:
                if time.monotonic() > deadline:
                    raise  # the retention sweep strikes them out later
                await asyncio.sleep(DB_RETRY_DELAY)


class AllGpusOffline(comfy_errors.ComfyError):
    """Every GPU stayed offline for as long as a job may wait for one."""

    transient = False

    def __init__(self, waited: float) -> None:
        span = f"{round(waited)} s" if waited < 90 else f"{round(waited / 60)} min"
        super().__init__(
            f"no GPU came back online within {span}, so the job was dropped; "
            "send the command again later",
            backend="any",
        )


def not_users_fault(exc: Exception) -> bool:
    """Whether a job that failed with `exc` should give its user's quota back: the GPU side
    let it down (a backend that went away or answered nonsense, a model or node found
    missing only when the prompt was posted, no GPU able to run it), as opposed to the
    workflow failing on the GPU with the values the user chose."""
    if isinstance(exc, comfy_errors.ComfyError) and exc.transient:
        return True
    if isinstance(exc, comfy_errors.WorkflowRejected):
        return bool(exc.missing_models or exc.missing_nodes)
    return isinstance(exc, pool.NoBackendCanRun | AllGpusOffline)


class JobRunner:
    """The job-running part of `Worker` (which it is mixed into, with `Settling`)."""

    async def _process(self, running: Running) -> None:
        job = running.job
        log_extra = {"job_id": str(job.id), "worker": self.worker_id}
        try:
            try:
                outputs = await self._execute_while_db_away(running)
            finally:
                running.progress_closed = True
                await self._release_slot(running)
                running.placed.set()
        except asyncio.CancelledError:
            if running.cancel_requested:
                await self._settle(running, lambda: self._mark_cancelled(running))
            else:
                await self._settle(running, lambda: self._hand_back(running))
                raise
            return
        except store_errors.CancelRequested:
            running.cancel_requested = True  # asked for before its prompt was sent: never sent
            await self._settle(running, lambda: self._mark_cancelled(running))
            return
        except comfy_errors.Interrupted as exc:
            message = str(exc)
            if running.cancel_requested:
                await self._settle(running, lambda: self._mark_cancelled(running))
            else:
                ended = await self._settle(
                    running, lambda: self._fail(running, message, transient=False)
                )
                await self._clean_up(running, ended)
            return
        except store_errors.LeaseLost:
            logger.warning(
                "lost the lease of a job; another worker has it",
                extra={"action": "lease_lost", **log_extra},
            )
            return
        except (comfy_errors.ComfyError, UsageError, workflow.WorkflowError) as exc:
            transient = bool(getattr(exc, "transient", False))
            message = str(exc)
            if running.cancel_requested:
                await self._settle(running, lambda: self._mark_cancelled(running))
                return
            if transient and isinstance(exc, comfy_errors.ComfyError):
                backend = self.pool.get(exc.backend)
                if backend is not None:
                    self._avoid[job.id] = backend.name
                    if isinstance(exc, comfy_errors.BackendUnreachable | comfy_errors.JobLost):
                        await self.pool.mark_down(backend, str(exc))
            refund = not_users_fault(exc)
            ended = await self._settle(
                running, lambda: self._fail(running, message, transient=transient, refund=refund)
            )
            await self._clean_up(running, ended)
            return
        except store_errors.StoreError as exc:
            logger.warning(
                "database error while running a job: %s",
                exc,
                extra={"action": "job_store_error", **log_extra},
            )
            return  # the lease expires and the job is recovered (re-attached) elsewhere
        except Exception:
            logger.exception(
                "unexpected error while running a job", extra={"action": "job_crashed", **log_extra}
            )
            await self._settle(
                running,
                lambda: self._fail(
                    running,
                    "the job failed because of an internal error; it will be retried",
                    transient=True,
                    refund=True,
                ),
            )
            return
        try:
            done = await self._settle(running, lambda: self._complete(running, outputs))
        except store_errors.LeaseLost:
            return
        if done is not None:
            self._avoid.pop(job.id, None)
            # The GPU host is cleaned while the result goes out: neither waits for the other.
            cleaning = asyncio.ensure_future(self._clean_up(running, done))
            try:
                # Shielded: a result half sent to the user must not be sent again later.
                await asyncio.shield(self._deliver(done, outputs, claimed=True))
            finally:
                await asyncio.shield(cleaning)

    async def _clean_up(self, running: Running, ended: jobs.Job | None) -> None:
        """Remove what the job left on its backend, now that its final status is written
        (`ended`). Not before: a worker that dies between the end of the prompt and that
        write leaves its successor the prompt's history entry and images to fetch, so the
        prompt is not run again. Not when the job goes back to the queue either (its retry
        re-attaches to the prompt), nor when the write failed (a successor takes over)."""
        left, running.cleanup = running.cleanup, []
        backend = running.cleanup_on
        if not left or backend is None or ended is None or not ended.status.finished:
            return
        traces = _Patient(JobTraces(self.db.traces, running.job.id), self.options.lease_seconds)
        for item in left:
            # Shielded: a stop must not leave half of it done; the sweep finishes the rest.
            await asyncio.shield(execute.clean_up(backend.client, item, traces))

    async def _workflow(self, job: jobs.Job) -> workflow.Workflow:
        """The job's workflow: the exact one it was queued with when the database keeps
        it (`comfyveil submit path/NAME.toml`), else its command as it stands now."""
        cached = self._workflows.get(job.workflow_hash)
        if cached is not None:
            return cached
        try:
            kept = await self.db.commands.version(job.workflow_hash)
        except workflow.WorkflowError as exc:
            raise UsageError(str(exc)) from exc
        if kept is not None:
            self._workflows[kept.hash] = kept
            return kept
        command = await self.db.commands.get(job.command)
        if command is None:
            raise UsageError(f"the command /{job.command} no longer exists")
        wf = command.to_workflow()
        self._workflows[wf.hash] = wf
        return wf

    async def _execute(self, running: Running) -> list[jobs.Output]:
        job = running.job
        wf = await self._workflow(job)
        # A command changed since the job was queued: check the values again.
        values = wf.validate(job.params) if wf.hash != job.workflow_hash else dict(job.params)
        prompt_id = str(job.id)
        # An earlier attempt (a worker that died, or a transient error after the backend
        # accepted the prompt) may have left the prompt running there: never pay twice.
        earlier = job.backend if job.submitted else None
        there = self.pool.get(earlier) if earlier is not None else None
        if there is not None and there.healthy:
            running.slot = self.pool.take(there.name, prompt_id)
            running.placed.set()
            assert running.slot is not None
            outcome = await self._reattach(running, wf, values, there)
        else:
            withdrawn = False
            if there is not None:
                # Its backend is down: take the prompt back out there, if it can be
                # reached, before it runs elsewhere; if not, once it answers again.
                withdrawn = await self._withdraw(there, prompt_id)
                if not withdrawn:
                    self._orphaned(there.name, prompt_id)
            elif earlier is not None:
                logger.info(
                    "the job was sent to backend %s, which this worker does not know; "
                    "running it here",
                    earlier,
                    extra={"action": "job_rerun", "job_id": prompt_id},
                )

            async def waiting(text: str) -> None:
                running.waiting = True
                running.placed.set()
                self._record_progress(
                    running,
                    {"state": "waiting", "text": text, "offline": not self.pool.any_healthy},
                    force=True,
                )

            try:
                others = sum(
                    1 for r in self._running.values() if r is not running and not r.placed.is_set()
                )
                running.slot = await self._slot_unless_offline(self.pool.acquire(
                    wf,
                    prompt_id,
                    on_wait=waiting,
                    avoid=earlier or self._avoid.get(job.id),
                    behind=others + (1 if self._more_queued else 0),
                    params=values,
                ))
            finally:
                if running.waiting:
                    running.waiting = False
                    self._wake.set()  # the queue may hold work for more free slots now
            running.placed.set()
            backend = running.slot.backend
            if backend is there and not withdrawn:
                # Back up again, and the only one that can take it: the prompt may be there.
                outcome = await self._reattach(running, wf, values, backend)
            else:
                # Recorded before the prompt is posted: a successor then looks for it there
                # first, and submits it again only if that backend never got it (JobLost).
                # A cancel asked for before this stops the job here (CancelRequested).
                running.job = await self._while_db_away(
                    lambda: self.store.mark_submitted(running.job, backend.name)
                )
                outcome = await self._run_on(running, wf, values, backend, attach=False)
        return [
            jobs.Output(
                filename=item.file.filename,
                kind=item.file.kind,
                mime=mimetypes.guess_type(item.file.filename)[0] or "application/octet-stream",
                data=item.data,
                index=index,
            )
            for index, item in enumerate(outcome.files)
        ]

    async def _execute_while_db_away(self, running: Running) -> list[jobs.Output]:
        """`_execute`, run again when the database could not be reached on the way (a
        restart): that happens only before the prompt is posted (following it needs no
        database), so running it again posts it once, or re-attaches to it. Meanwhile the
        lease is renewed as soon as the database is back: the job stays with this worker."""
        deadline = time.monotonic() + self.options.lease_seconds * 10
        while True:
            try:
                return await self._execute(running)
            except store_errors.DatabaseUnreachable:
                if time.monotonic() > deadline:
                    raise
                running.cleanup.clear()  # nothing was left there: it had not been posted
                await self._release_slot(running)
                await asyncio.sleep(DB_RETRY_DELAY)

    async def _while_db_away(self, write: Callable[[], Awaitable[jobs.Job]]) -> jobs.Job:
        """`write`, tried again while the database cannot be reached (a restart), for up
        to twice the lease; then the error, and the lease runs out (a successor)."""
        deadline = time.monotonic() + self.options.lease_seconds * 2
        while True:
            try:
                return await write()
            except store_errors.DatabaseUnreachable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(DB_RETRY_DELAY)

    async def _reattach(
        self,
        running: Running,
        wf: workflow.Workflow,
        values: Mapping[str, object],
        backend: pool.Backend,
    ) -> execute.Outcome:
        """Follow the job's prompt on `backend`, where an earlier attempt sent it."""
        prompt_id = str(running.job.id)
        logger.info(
            "re-attaching to a job on backend %s",
            backend.name,
            extra={"action": "job_reattach", "job_id": prompt_id},
        )
        try:
            return await self._run_on(running, wf, values, backend, attach=True)
        except (comfy_errors.JobLost, notrace.FramesLost):
            # It never reached the GPU, or the backend restarted and forgot it, or (no
            # trace) its images went to the socket of the worker that died: run it afresh
            # on the same backend, within the same attempt.
            logger.info(
                "backend %s no longer knows the job; submitting it again",
                backend.name,
                extra={"action": "job_resubmit", "job_id": prompt_id},
            )
            return await self._run_on(running, wf, values, backend, attach=False)

    async def _withdraw(self, backend: pool.Backend, prompt_id: str) -> bool:
        """Interrupt or drop a prompt an earlier attempt left on `backend`; False when the
        backend could not be asked (it may still hold the prompt)."""
        try:
            async with asyncio.timeout(WITHDRAW_TIMEOUT):
                outcome = await backend.client.cancel(prompt_id)
        except (comfy_errors.ComfyError, TimeoutError) as exc:
            logger.info(
                "could not take the job's earlier prompt back from backend %s: %s",
                backend.name,
                str(exc) or type(exc).__name__,
                extra={"action": "job_withdraw_failed", "job_id": prompt_id},
            )
            return False
        logger.info(
            "took the job's earlier prompt back from backend %s: %s",
            backend.name,
            outcome,
            extra={"action": "job_withdrawn", "job_id": prompt_id},
        )
        return True

    async def _withdraw_cancelled(
        self, job_id: uuid.UUID, after: asyncio.Task[None] | None = None
    ) -> None:
        """A job no worker runs was cancelled (it was queued for a retry): stop the prompt
        an earlier attempt left on its backend, if that backend is one of ours. `after`:
        this worker's task of the job, still finishing the attempt that requeued it."""
        if after is not None:
            await asyncio.wait({after})
            if job_id in self._cancelled_here:
                return  # the task itself stopped it
        try:
            job = await self.store.get(job_id)
        except store_errors.StoreError:
            return
        if job is None or job.status is not jobs.Status.CANCELLED or not job.submitted:
            return
        backend = self.pool.get(job.backend) if job.backend else None
        if (
            backend is not None
            and job_id not in self._running
            and not await self._withdraw(backend, str(job_id))
        ):
            self._orphaned(backend.name, str(job_id))

    def _orphaned(self, backend: str, prompt_id: str) -> None:
        """Remember a prompt left on a backend that could not be asked to drop it."""
        left = self._orphans.setdefault(backend, set())
        if len(left) < MAX_ORPHANS:
            left.add(prompt_id)

    async def _withdraw_orphans(self) -> None:
        """Take back the prompts left on backends that answer again, unless the job has
        gone back to that backend since (then the prompt there is its live one)."""
        for name, left in list(self._orphans.items()):
            backend = self.pool.get(name)
            if backend is None or not backend.healthy:
                continue
            for prompt_id in list(left):
                try:
                    job = await self.store.get(uuid.UUID(prompt_id))
                except store_errors.StoreError:
                    return
                live = job is not None and not job.status.finished and job.backend == name
                if live or await self._withdraw(backend, prompt_id):
                    left.discard(prompt_id)
            if not left:
                self._orphans.pop(name, None)

    def _cancelled_elsewhere(self, job_id: uuid.UUID) -> None:
        if job_id in self._cancelled_here:
            # Its own task stopped it: asking its backend again would interrupt it twice,
            # and on a server that ignores the prompt id, the next user's job.
            return
        # A task of the job still here may be one that stops it itself, or one that
        # requeued it a moment ago and is finishing: which, is known once it ends.
        running = self._running.get(job_id)
        task = asyncio.create_task(
            self._withdraw_cancelled(job_id, running.task if running else None),
            name=f"withdraw-{job_id}",
        )
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _slot_unless_offline(self, acquire: Awaitable[pool.Slot]) -> pool.Slot:
        """The slot `acquire` gets, unless every GPU stays offline for `max_wait_offline`
        seconds in a row first (then AllGpusOffline: the job fails with a plain sentence
        instead of waiting in silence for ever)."""
        task = asyncio.ensure_future(acquire)
        limit = self.options.max_wait_offline
        offline_since: float | None = None
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=min(OFFLINE_CHECK, limit))
                if done:
                    return task.result()
                if self.pool.any_healthy:
                    offline_since = None
                    continue
                now = time.monotonic()
                offline_since = offline_since if offline_since is not None else now
                if now - offline_since >= limit:
                    raise AllGpusOffline(limit)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _run_on(
        self,
        running: Running,
        wf: workflow.Workflow,
        values: Mapping[str, object],
        backend: pool.Backend,
        *,
        attach: bool,
    ) -> execute.Outcome:
        job = running.job
        inputs: dict[str, execute.InputImage] = {}
        if not attach:
            images = await self.store.inputs(job.id) if wf.image_params else []
            for name, image in zip(wf.image_params, images, strict=False):
                inputs[name] = execute.InputImage(image.data, image.mime)
            running.executing_since = running.steps_from = None  # a new run of the prompt
            submitted: dict[str, Any] = {"state": "submitted", "backend": backend.name}
            slot = running.slot
            if slot is not None and slot.expected is not None:
                # What the pool expected when it chose this GPU: `jobs show` prints it.
                submitted["expected_seconds"] = round(slot.expected, 1)
            self._record_progress(running, submitted, force=True)
        slot = running.slot
        no_trace = backend.config.no_trace
        running.cleanup_on = backend
        left: tuple[notrace.Trace, ...] = ()
        if no_trace and (attach or job.attempts > 1):
            # What an earlier attempt (or worker) left there, to be cleaned with this one's.
            left = tuple(await self.db.traces.of_job(job.id, backend.name))
        outcome = await execute.execute(
            backend.client,
            wf,
            values,
            inputs,
            prompt_id=str(job.id),
            on_event=self._progress_callback(running, wf.graph),
            timeout=self.options.job_timeout,
            attach=attach,
            on_ran=lambda: self._release_slot(running),
            no_trace=no_trace,
            traces=JobTraces(self.db.traces, job.id) if no_trace else None,
            left=left,
            cleanup=running.cleanup,
        )
        if slot is not None and not attach:  # a re-attached run's start is not ours to time
            self.pool.learn(slot, outcome.result.timings)
        return outcome

    async def _release_slot(self, running: Running) -> None:
        slot, running.slot = running.slot, None
        if slot is not None:
            await self.pool.release(slot)
            self._wake.set()

    # --- progress and cancellation -------------------------------------------------

    def _progress_callback(
        self, running: Running, graph: Mapping[str, Any]
    ) -> Callable[[events.Event], Awaitable[None]]:
        node_types = {k: str(v.get("class_type", "")) for k, v in graph.items()}

        async def on_event(event: events.Event) -> None:
            data: dict[str, Any] | None = None
            force = False
            if isinstance(event, events.QueuePosition):
                data = {"state": "queued_on_backend", "position": event.position}
                force = True
            elif isinstance(event, events.ExecutionStart):
                running.executing_since = time.monotonic()
                data = {"state": "running"}
                force = True
                if running.slot is not None:  # its GPU's backlog counts from its progress now
                    self.pool.progress(running.slot, started=True)
            elif isinstance(event, events.Executing) and event.node is not None:
                data = {"state": "running", "node": event.node}
            elif isinstance(event, events.Progress) and execute.shows_steps(event, node_types):
                percent = round(100.0 * event.value / event.max, 1) if event.max else None
                data = {
                    "state": "running",
                    "node": event.node,
                    "value": event.value,
                    "max": event.max,
                    "percent": percent,
                }
                pace = _step_seconds(running, event.node, float(event.value))
                if pace is not None:
                    data["step_s"] = round(pace, 4)
                if running.slot is not None:
                    self.pool.progress(
                        running.slot, done=float(event.value), steps=int(event.max), step_s=pace
                    )
            elif isinstance(event, events.Preview):
                self._record_preview(running, event)
            if data is not None and data["state"] == "running" and running.executing_since is None:
                # Re-attached to a prompt that started before (its start is kept in the
                # store), or an event stream that skipped it: running from now at the latest.
                running.executing_since = time.monotonic()
            if data is not None:
                slot = running.slot
                if slot is not None:
                    data["backend"] = slot.backend.name
                self._record_progress(running, data, force=force)

        return on_event

    def _record_preview(self, running: Running, event: events.Preview) -> None:
        """Keep the newest preview frame for the job's client, written in the background
        (never on the job's path), at most every PREVIEW_INTERVAL, and only for a job
        whose client asked for partial images."""
        if running.progress_closed or running.previews_wanted is False:
            return
        running.preview_next = (event.mime, event.image)
        if running.preview_task is None or running.preview_task.done():
            task = asyncio.create_task(
                self._write_previews(running), name=f"preview-{running.job.id}"
            )
            running.preview_task = task
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)

    async def _write_previews(self, running: Running) -> None:
        store = previews.PreviewStore(self.db.pool)
        try:
            if running.previews_wanted is None:
                running.previews_wanted = await store.wanted(running.job.id)
            while running.previews_wanted and not running.progress_closed:
                frame, running.preview_next = running.preview_next, None
                if frame is None:
                    return
                await store.save(running.job.id, *frame)
                await asyncio.sleep(PREVIEW_INTERVAL)
        except store_errors.StoreError as exc:  # previews are best effort
            logger.info("preview not saved: %s", exc, extra={"action": "preview_unsaved"})

    def _record_progress(
        self, running: Running, data: Mapping[str, Any], *, force: bool = False
    ) -> None:
        """Save the job's progress in the background, the latest first.

        The job never waits for its progress row: events from the backend keep flowing
        while a write is pending, and they collapse into the newest one. Writes trail the
        events, a change of state by PROGRESS_SETTLE, progress by up to PROGRESS_INTERVAL
        after the last write, so a job that ends sooner writes none: its final status says
        all. A cancel request read back with a write cancels the job.
        """
        if running.progress_closed:
            return
        now = time.monotonic()
        due = now + PROGRESS_SETTLE if force else max(now, running.progress_at + PROGRESS_INTERVAL)
        if due < running.progress_due:
            running.progress_due = due
            running.progress_sooner.set()
        running.progress_next = dict(data)
        if running.progress_task is None or running.progress_task.done():
            task = asyncio.create_task(
                self._write_progress(running), name=f"progress-{running.job.id}"
            )
            running.progress_task = task
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)

    async def _write_progress(self, running: Running) -> None:
        while running.progress_next is not None and not running.progress_closed:
            while (wait := running.progress_due - time.monotonic()) > 0:
                running.progress_sooner.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(running.progress_sooner.wait(), wait)
            if running.progress_closed or running.progress_next is None:
                return
            data, running.progress_next = running.progress_next, None
            running.progress_at, running.progress_due = time.monotonic(), math.inf
            try:
                since = running.executing_since if data.get("state") == "running" else None
                cancel = await self.store.record_progress(
                    running.job,
                    data,
                    executing_for=None if since is None else max(0.0, time.monotonic() - since),
                )
            except store_errors.LeaseLost:
                if running.progress_closed or running.settled:
                    return  # the job ended meanwhile: its final status is the last word
                logger.warning(
                    "lease lost; dropping the job here",
                    extra={"action": "lease_lost", "job_id": str(running.job.id)},
                )
                running.cancelling = True
                if running.task is not None and not running.task.done():
                    running.task.cancel()
                return
            except store_errors.StoreError as exc:  # progress is best effort
                logger.info("progress not saved: %s", exc, extra={"action": "progress_unsaved"})
                continue
            if cancel:
                self._request_cancel(running)

    def _request_cancel(self, running: Running) -> None:
        if running.cancelling:
            return
        running.cancel_requested = True
        running.cancelling = True
        task = asyncio.create_task(self._cancel(running), name=f"cancel-{running.job.id}")
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _cancel(self, running: Running) -> None:
        """Stop this one prompt on its backend, then end the job as cancelled."""
        slot = running.slot
        if slot is not None:
            try:
                outcome = await slot.backend.client.cancel(str(running.job.id))
                logger.info(
                    "cancel on backend %s: %s",
                    slot.backend.name,
                    outcome,
                    extra={"action": "job_cancel", "job_id": str(running.job.id)},
                )
            except comfy_errors.ComfyError as exc:
                logger.info("could not stop the job on its backend: %s", exc)
        if running.task is not None and not running.task.done():
            running.task.cancel()
        if slot is not None and slot.backend.config.no_trace:
            if running.task is not None:
                await asyncio.wait({running.task})  # it cleans up itself when it can
            await self._clean_after_cancel(running.job, slot.backend)

    async def _clean_after_cancel(self, job: jobs.Job, backend: pool.Backend) -> None:
        """Remove what a cancelled job left on its backend once the prompt has stopped there
        (a cancelled task leaves its traces, as a job handed back must)."""
        try:
            found = await self.db.traces.of_job(job.id, backend.name)
            if not found:
                return
            history = [t for t in found if t.kind == "history"]
            gone = await notrace.scrub(
                backend.client,
                history[0].name if history else None,
                [t for t in found if t.kind != "history"],
            )
            await self.db.traces.drop(backend.name, gone)
        except (comfy_errors.ComfyError, store_errors.StoreError) as exc:
            logger.info("could not clean up after a cancelled job: %s", exc,
                        extra={"action": "scrub_failed", "job_id": str(job.id)})


def _step_seconds(running: Running, node: str | None, value: float) -> float | None:
    """Seconds a sampler step took so far in this run (from its first tick seen to this
    one); None until two ticks of one node were seen."""
    now = time.monotonic()
    first = running.steps_from
    if first is None or first[0] != node or value <= first[1]:
        running.steps_from = (node, value, now)
        return None
    return (now - first[2]) / (value - first[1])
