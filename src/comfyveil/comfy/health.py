"""The pool's health checks: probing each backend, marking it down and up, and reading
and remembering its node and model lists.

Every configured backend (one ComfyUI, usually one GPU) is probed in a side task: its
health and queue length often, its node classes and model files (``/object_info``) when
it comes up and then now and then. A backend that fails a probe or a job is marked down
and probed again with exponential backoff. The lists a backend last answered outlive the
process (`ModelMemory`), so what a backend that is down lacks is known at start.

`Probing` is mixed into `pool.Pool`, which holds the backends it probes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from comfyveil import config
from comfyveil.comfy import errors

if TYPE_CHECKING:
    from comfyveil.comfy.pool import Backend, OnDown

logger = logging.getLogger("comfyveil.comfy.pool")  # the name it logged under before the split

PROBE_INTERVAL = 2.0  # seconds between health probes of a backend that is up
CAPABILITY_REFRESH = 300.0  # seconds between two reads of /object_info of a backend
# A job no backend can run makes the pool read the lists again first, unless they are
# this fresh: a model installed a minute ago must not be refused for minutes.
REFUSAL_REFRESH = 5.0
LOOK_REFRESH = 1.0  # an admin's look at the backends reads them again, at most this often
BACKOFF_START = 0.5  # seconds before the first re-probe of a backend that went down
BACKOFF_MAX = 30.0  # seconds, the longest wait between re-probes
PROBE_TIMEOUT = 10.0  # seconds one probe may take


class ModelMemory(Protocol):
    """Where the last node and model lists of each backend outlive the process (the
    database's `store.model_lists`)."""

    async def remember(self, backend: config.BackendConfig, info: Mapping[str, Any]) -> None: ...

    async def recall(
        self, backends: Sequence[config.BackendConfig]
    ) -> dict[str, Mapping[str, Any]]: ...


class BackendClient(Protocol):
    """What the pool needs of a ComfyUI client (comfy.client.ComfyClient has it)."""

    async def __aenter__(self) -> Any: ...
    async def __aexit__(self, *exc: object) -> Any: ...
    async def system_stats(self) -> Any: ...
    async def queue(self) -> Any: ...
    async def object_info(self, *, refresh: bool = False) -> Mapping[str, Any]: ...


def queue_length(answer: Any) -> int:
    """Jobs running plus pending on a backend, from whatever `client.queue()` returned."""
    if isinstance(answer, int):
        return answer
    for running, pending in (("running", "pending"), ("queue_running", "queue_pending")):
        if hasattr(answer, running):
            return len(getattr(answer, running)) + len(getattr(answer, pending))
        if isinstance(answer, Mapping) and running in answer:
            return len(answer[running]) + len(answer.get(pending) or ())
    raise errors.BackendProtocolError("the backend's queue answer is not understood")


def queue_ids(answer: Any) -> set[str] | None:
    """The prompt ids running or pending on a backend, when the answer names them."""
    items: list[Any] = []
    for running, pending in (("running", "pending"), ("queue_running", "queue_pending")):
        if hasattr(answer, running):
            items = [*getattr(answer, running), *getattr(answer, pending)]
            break
        if isinstance(answer, Mapping) and running in answer:
            items = [*answer[running], *(answer.get(pending) or ())]
            break
    else:
        return None
    ids: set[str] = set()
    for item in items:
        prompt_id = getattr(item, "prompt_id", None)
        if prompt_id is None and isinstance(item, list | tuple) and len(item) > 1:
            prompt_id = item[1]  # ComfyUI's raw [number, prompt_id, prompt, ...]
        if not isinstance(prompt_id, str):
            return None
        ids.add(prompt_id)
    return ids


class Probing:
    """The health part of `pool.Pool` (which it is mixed into)."""

    backends: dict[str, Backend]
    probe_interval: float
    _memory: ModelMemory | None
    _on_down: OnDown | None

    async def _recall(self) -> None:
        """Give the backends that did not answer the lists they had when they last did, so
        what they lack is known (and refused) until they answer again."""
        unknown = [b for b in self.backends.values() if b.object_info is None]
        if self._memory is None or not unknown:
            return
        recalled = await self._memory.recall([b.config for b in unknown])
        for backend in unknown:
            info = recalled.get(backend.name)
            if info is not None and backend.object_info is None:
                backend.object_info = backend.kept = info
                backend.remembered = True

    async def _keep(self, backend: Backend) -> None:
        """Hand lists just read to the memory, when they differ from those it has."""
        info = backend.object_info
        backend.remembered = False
        if self._memory is None or info is None or info == backend.kept:
            return
        backend.kept = info
        await self._memory.remember(backend.config, info)

    async def refresh_models(self, *, max_age: float = REFUSAL_REFRESH) -> bool:
        """Read the node and model lists (/object_info) of the backends that are up again
        now, those read more than `max_age` seconds ago; True when one changed. Asked for
        when a job would be refused for a missing model and by an admin's look at the
        backends, so a model just installed counts at once, not at the next scheduled
        read (`CAPABILITY_REFRESH`)."""
        now = time.monotonic()
        stale = [
            b for b in self.backends.values() if b.healthy and now - b.capabilities_at > max_age
        ]
        if not stale:
            return False
        changed = await asyncio.gather(*(self._read_models(b) for b in stale))
        if any(changed):
            await self._notify()
        return any(changed)

    async def _read_models(self, backend: Backend) -> bool:
        # Marked read before the answer: jobs refused together ask for one read, not many.
        backend.capabilities_at = time.monotonic()
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                info = await backend.client.object_info(refresh=True)
        except (errors.ComfyError, TimeoutError, OSError) as exc:
            # The probes decide whether it is down; this read is only a courtesy.
            logger.info(
                "could not read the models of backend %s: %s",
                backend.name,
                str(exc) or type(exc).__name__,
                extra={"action": "models_read_failed", "backend": backend.name},
            )
            return False
        changed = info != backend.object_info
        backend.object_info = info
        await self._keep(backend)
        return changed

    async def mark_down(self, backend: Backend, reason: str, *, probed: bool = False) -> None:
        """A job or probe (`probed`) found the backend failing: stop sending it work for
        a while.

        Only a failed probe, or the failure that takes it down, makes the next probe
        wait longer. The jobs that were on a backend when its way was cut all fail at
        once and their retries fail again: each had doubled the wait and put the next
        probe off anew, so a worker with several jobs there waited 30 s between probes
        and saw a hidden service down for up to 155 s after anon came back, where the
        other processes saw it up within seconds (chaos, anon mode).
        """
        backend.downs += 1
        now = time.monotonic()
        if backend.healthy or probed:
            backend.failures += 1
            backend.next_probe = now + min(
                BACKOFF_MAX, BACKOFF_START * 2 ** (backend.failures - 1)
            )
        # Every failure while down too, at INFO: how long a backend stays down after its
        # way back opened (anon starting again) is read from these, process by process.
        logger.log(
            logging.WARNING if backend.healthy else logging.INFO,
            "backend %s %s (%s); probing again in %.1f s",
            backend.name,
            "is down" if backend.healthy else "still down",
            reason,
            max(0.0, backend.next_probe - now),
            extra={
                "action": "backend_down" if backend.healthy else "backend_still_down",
                "backend": backend.name,
            },
        )
        backend.healthy = False
        backend.last_error = reason
        if self._on_down is not None:
            await self._on_down(backend.config)
        await self._notify()

    async def probe(self, backend: Backend, *, as_of: int | None = None) -> bool:
        """Probe one backend now; True when it is up.

        `as_of`: the backend's `downs` when the probe was decided on (default: now). A
        probe whose answer may predate the backend's last marking down (a job that found
        it unreachable meanwhile) brings no news: it stays down until a later probe.

        One probe of a backend at a time: a caller that finds one on its way shares its
        answer. A probe of a backend that is down reads its /object_info too (390 KB);
        the retries of three jobs each probing a hidden service every 2 s, beside the
        health loop, read it four times at once through anon, outlasted the probe's
        deadline together, and each failure voided the others' answers: that worker saw
        the backend down for a minute and a half while the other processes reached it.
        """
        as_of = backend.downs if as_of is None else as_of
        on_its_way = backend.probing
        if on_its_way is None or on_its_way.done():
            on_its_way = backend.probing = asyncio.ensure_future(self._probe(backend, as_of))
        # Shielded: a caller cancelled (a job's retry given up) leaves the others' answer.
        return await asyncio.shield(on_its_way)

    async def _probe(self, backend: Backend, as_of: int) -> bool:
        # Jobs of ours released while the probe runs may still show in its answer.
        released_before = set(backend.released)
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                answer = await backend.client.queue()
                now = time.monotonic()
                read = (
                    backend.object_info is None
                    or backend.remembered
                    or not backend.healthy
                    or now - backend.capabilities_at > CAPABILITY_REFRESH
                )
                if read:
                    backend.object_info = await backend.client.object_info(refresh=True)
                    backend.capabilities_at = now
        except TimeoutError:  # the probe's own deadline: its error has no words
            await self.mark_down(
                backend,
                f"backend {backend.name} did not answer within {PROBE_TIMEOUT:g} s",
                probed=True,
            )
            return False
        except (errors.ComfyError, OSError) as exc:
            await self.mark_down(
                backend, str(exc) if str(exc) else type(exc).__name__, probed=True
            )
            return False
        except Exception as exc:  # one odd answer must not end health checks for all
            logger.exception("probing backend %s failed unexpectedly", backend.name)
            await self.mark_down(backend, f"probe failed ({type(exc).__name__})", probed=True)
            return False
        if backend.downs != as_of:
            # Marked down while this probe was on its way: its answer may be from before
            # the failure, and bringing the backend up would send the retry straight back
            # to it and undo its backoff (seen when a slow loop finished the probe late).
            return False
        if read:
            await self._keep(backend)
        backend.remote_queue = queue_length(answer)
        backend.remote_ids = queue_ids(answer)
        backend.local_at_probe = len(backend.jobs)
        backend.released -= released_before
        backend.next_probe = time.monotonic() + self.probe_interval
        if not backend.healthy:
            logger.info(
                "backend %s is up",
                backend.name,
                extra={"action": "backend_up", "backend": backend.name},
            )
        backend.healthy = True
        backend.failures = 0
        backend.last_error = None
        await self._notify()
        return True

    async def _health_loop(self) -> None:
        while True:
            now = time.monotonic()
            due = [b for b in self.backends.values() if b.next_probe <= now]
            if due:
                # As of now: a backend marked down before its probe task starts waits
                # for its backoff.
                await asyncio.gather(*(self.probe(b, as_of=b.downs) for b in due))
            upcoming = min(b.next_probe for b in self.backends.values())
            await asyncio.sleep(max(0.05, min(self.probe_interval, upcoming - time.monotonic())))
