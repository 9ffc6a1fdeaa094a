"""Taking prompts back off backends: a running job whose cancel was asked for, a
cancelled retry whose earlier attempt left its prompt on a backend, and prompts left on
a backend that could not be reached (taken back once it answers), with what a
cancelled job left there (no trace)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Literal

from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import notrace, pool
from comfyveil.store import errors as store_errors
from comfyveil.store import jobs
from comfyveil.worker.options import MAX_ORPHANS, WITHDRAW_TIMEOUT
from comfyveil.worker.running import Running

logger = logging.getLogger("comfyveil.worker")  # the name it logged under before the split


class Cancelling:
    """The cancelling part of `Worker` (which it is mixed into)."""

    async def _withdraw(self, backend: pool.Backend, prompt_id: str) -> bool:
        """Interrupt or drop a prompt an earlier attempt left on `backend`; False when the
        backend could not be asked (it may still hold the prompt)."""
        return await self._withdrawn(backend, prompt_id) is not None

    async def _withdrawn(
        self, backend: pool.Backend, prompt_id: str
    ) -> Literal["interrupted", "removed", "unknown"] | None:
        """`_withdraw`, saying what became of the prompt: "unknown" when it was neither
        running nor waiting there (it ended there, or never arrived); None when the
        backend could not be asked."""
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
            return None
        logger.info(
            "took the job's earlier prompt back from backend %s: %s",
            backend.name,
            outcome,
            extra={"action": "job_withdrawn", "job_id": prompt_id},
        )
        return outcome

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
            logger.info(
                "could not clean up after a cancelled job: %s",
                exc,
                extra={"action": "scrub_failed", "job_id": str(job.id)},
            )
