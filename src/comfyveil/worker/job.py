"""Running one claimed job: placing it on a backend (or re-attaching to the prompt a backend
already has), executing it, turning the outcome into a final write, and removing what it
left on its backend once that write is in. Its progress on the way is published by
`progress`, cancel requests are acted on by `cancel`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mimetypes
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import execute, notrace, pool, routing, uploads, workflow
from comfyveil.errors import UsageError
from comfyveil.i18n import N_
from comfyveil.store import errors as store_errors
from comfyveil.store import jobs
from comfyveil.store.traces import JobTraces
from comfyveil.worker.failures import AllGpusOffline, not_users_fault
from comfyveil.worker.options import DB_RETRY_DELAY, OFFLINE_CHECK, UNREACHABLE_PROBE
from comfyveil.worker.running import Running

logger = logging.getLogger("comfyveil.worker")  # the name it logged under before the split


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


class JobRunner:
    """The job-running part of `Worker` (which it is mixed into, with `Reporting`,
    `Cancelling` and `Settling`)."""

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

        withdrawn = ended_there = False
        if there is not None and not there.healthy:
            # Its backend is down: take the prompt back out there, if it can be reached,
            # before it runs elsewhere. If not (a partition, its anon starting again), its
            # GPU may still run it: wait a while for it to answer, then follow it there.
            taken = await self._withdrawn(there, prompt_id)
            # Neither running nor waiting there: it may have ended there while the way to
            # it was cut (an anon starting again): its result is followed there, not run
            # again elsewhere (a prompt that never arrived is posted there again).
            ended_there = taken == "unknown"
            withdrawn = taken is not None and not ended_there
            if taken is None:
                # Remembered first, so that a cancel during the wait still takes it back
                # once it answers; forgotten when the job follows it there.
                self._orphaned(there.name, prompt_id)
                if await self._answers_again(there, running):
                    self._orphans.get(there.name, set()).discard(prompt_id)
        if there is not None and (there.healthy or ended_there) and not withdrawn:
            running.slot = self.pool.take(there.name, prompt_id)
            running.placed.set()
            assert running.slot is not None
            outcome = await self._reattach(running, wf, values, there)
        else:
            if there is None and earlier is not None:
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
                    planned=job.plan,
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

    async def _answers_again(self, backend: pool.Backend, running: Running) -> bool:
        """Whether `backend`, which may still run the job's prompt but cannot be reached,
        answers again within `unreachable_wait` seconds (probed every UNREACHABLE_PROBE
        seconds: the pool's own probes back off up to half a minute). Run elsewhere at
        once, the prompt ran twice whenever the outage outlasted it: an anon killed on the
        bot's host and started again takes seconds to reach a hidden service again.
        Meanwhile the worker goes on claiming jobs for its other GPUs (the job is not
        `waiting` for a free slot), and the job shows as waiting for a GPU."""
        deadline = time.monotonic() + self.options.unreachable_wait
        self._record_progress(
            running,
            # stored in English, as the pool's are; the front ends say it in the job's language
            {"state": "waiting", "text": N_("waiting for a GPU"), "offline": False},
            force=True,
        )
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(UNREACHABLE_PROBE, left))
            if backend.healthy or await self.pool.probe(backend):
                return True

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
        inputs: dict[str, uploads.InputImage] = {}
        if not attach:
            images = await self.store.inputs(job.id) if wf.image_params else []
            for name, image in zip(wf.image_params, images, strict=False):
                inputs[name] = uploads.InputImage(image.data, image.mime)
            running.executing_since = running.steps_from = None  # a new run of the prompt
            running.sampler_steps = {}
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
            running.measured = routing.measured(wf, outcome.result.timings)
        return outcome

    async def _release_slot(self, running: Running) -> None:
        slot, running.slot = running.slot, None
        if slot is not None:
            await self.pool.release(slot)
            self._wake.set()
