"""One workflow run on one backend: upload inputs, submit, follow, download outputs.

Shared by `comfyveil generate`, the worker and the benchmark so the three follow the
same path. Input images are uploaded under a name derived from their content, never
the user's file name (`comfy.uploads`). With `no_trace` they go to the backend's temp
folder under a random name instead, so do the images (or, with `no_trace = "memory"`,
they come back over the WebSocket), and all of them are overwritten and the history
entry deleted when the job ends (`comfy.notrace`), or, for a caller that must first store
the result (`cleanup`), once it says so. Outputs lose their metadata
(`comfyveil.metadata`) unless asked not to. An input larger than the workflow can use is
scaled down to that size before it is sent (`uploads.fit_inputs`): over a slow link a
job's time is its bytes.

One deadline covers the whole job, upload, run and download, so a backend that
trickles its answer or stops reading ends the job in time; the outputs one job may
bring back are capped in number and bytes (`[limits]`), and file names a backend
sends never choose where a file lands (`comfy.downloads`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import downloads, errors, events, notrace, results, uploads, workflow
from comfyveil.comfy.downloads import OutputData
from comfyveil.comfy.uploads import InputImage

logger = logging.getLogger(__name__)

EventCallback = Callable[[events.Event], Awaitable[None] | None]
RanCallback = Callable[[], Awaitable[None]]

STALLED = 2.0  # seconds without a byte moving after which a phase counts as stalled
Phase = Literal["upload", "run", "download"]


@dataclass(frozen=True, slots=True)
class Outcome:
    result: results.RunResult
    files: tuple[OutputData, ...]
    upload_seconds: float
    run_seconds: float  # submit to done, as the caller saw it
    download_seconds: float
    uploaded: Mapping[str, str] = field(default_factory=dict)  # param -> name in the graph
    fit_seconds: float = 0.0  # scaling the inputs down before the upload (CPU)


@dataclass(frozen=True, slots=True)
class Cleanup:
    """What a no-trace job left on its backend, for the caller to remove (`clean_up`) once
    the result is safe: until then a successor can still fetch it."""

    prompt_id: str
    pending: tuple[notrace.Trace, ...]
    finished: bool


class JobTimedOut(errors.ComfyError):
    """The job took too long (on the GPU, or moving its files) and was stopped."""


class _Watch:
    """Where a job is (upload, run, download) and when a byte last moved, so a job that
    runs out of time can say why."""

    def __init__(self) -> None:
        self.phase: Phase = "upload"
        self.moved_at = time.monotonic()
        self.moved_bytes = 0  # in this phase

    def enter(self, phase: Phase) -> None:
        self.phase = phase
        self.moved_at = time.monotonic()
        self.moved_bytes = 0

    def moved(self, count: int = 0) -> None:
        self.moved_at = time.monotonic()
        self.moved_bytes += count

    def stalled(self, timeout: float | None) -> bool:
        quiet = STALLED if timeout is None else min(STALLED, timeout / 2)
        return time.monotonic() - self.moved_at >= quiet

    def timed_out(self, backend: str, timeout: float | None) -> errors.ComfyError:
        limit = f"{timeout:.0f} s" if timeout is not None else "its time"
        if self.phase == "upload":
            # A small file leaves at once into the sockets' buffers: silence after it is
            # a backend that stopped reading or answering, not a slow link.
            if self.stalled(timeout):
                return errors.BackendStopped("during the upload", backend=backend)
            return JobTimedOut(
                f"the upload to backend {backend} took longer than the job's {limit}",
                backend=backend,
            )
        if self.phase == "download":
            if self.moved_bytes == 0:
                text = f"backend {backend} stopped answering while sending the results"
            else:  # a trickle, or a link too slow for what it carries
                text = f"backend {backend} was too slow sending the results"
            return JobTimedOut(f"{text}; the job was stopped after {limit}", backend=backend)
        return JobTimedOut(
            f"the job took longer than {limit} on backend {backend} and was stopped",
            backend=backend,
        )


async def execute(
    client: comfy_client.ComfyClient,
    wf: workflow.Workflow,
    values: Mapping[str, object],
    inputs: Mapping[str, InputImage] | None = None,
    *,
    prompt_id: str | None = None,
    on_event: EventCallback | None = None,
    timeout: float | None = None,
    attach: bool = False,
    on_ran: RanCallback | None = None,
    out_dir: Path | None = None,
    no_trace: bool | str = False,
    keep_metadata: bool = False,
    traces: notrace.TraceLog | None = None,
    left: tuple[notrace.Trace, ...] = (),
    cleanup: list[Cleanup] | None = None,
) -> Outcome:
    """Run `wf` with validated `values` on `client`'s backend and download the outputs.

    With `attach=True` the prompt was submitted earlier (by a worker that died) and is
    followed by id instead of being submitted again, so the GPU work is not paid twice.
    `on_ran` is awaited once the backend is done with the prompt, before the outputs
    are downloaded: from then on its GPU can take the next job, however slow the link
    that carries the files back. `timeout` covers the upload, the run and the download
    together. With `out_dir` the downloaded outputs are streamed into that folder, never
    held in memory (`OutputData.path`); images that came over the WebSocket stay in
    memory (`save_outputs` writes them).

    With `no_trace`, what the job leaves on the backend is written down in `traces`
    before it is left there (`left`: what an earlier attempt left) and removed when the
    job ends, however it ends, unless this task is cancelled or a transient error cut
    it short: the prompt may still run there, for a successor or a retry to re-attach
    to, so its traces stay written down. With `cleanup`, what would be removed is
    appended there instead, for the caller to remove with `clean_up` once the result is
    stored: a caller that dies before that leaves a successor the images to fetch.

    Raises:
        ComfyError: the backend refused, failed, was interrupted or took too long.
        FramesLost: the images were sent to a socket that was gone.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    watch = _Watch()
    started = time.perf_counter()
    run_started = fitted = started
    pid = prompt_id or str(uuid.uuid4())
    pending: list[notrace.Trace] = list(left)
    savers: dict[str, str] = {}
    collector: notrace.FrameCollector | None = None
    finished = False
    how = notrace.mode(no_trace)
    in_temp = False  # the images come as temp files from savers `to_temp` made
    try:
        timer = asyncio.timeout_at(deadline)
        try:
            async with timer:
                if inputs and not attach:
                    inputs = await uploads.fit_inputs(
                        wf, values, inputs, client.limits.max_input_pixels
                    )
                fitted = time.perf_counter()
                watch.enter("upload")  # the scaling moved no bytes: no stall until now
                if how != "off":
                    todo = {} if attach else dict(inputs or {})
                    names = {p: notrace.upload_trace(image.mime) for p, image in todo.items()}
                    fresh = [notrace.Trace("history", pid), *names.values()]
                    if traces is not None and not attach:
                        await traces.left(client.name, fresh)
                    pending.extend(t for t in fresh if t not in pending)
                    uploaded = await uploads.upload_traceless(
                        client, todo, names, on_sent=watch.moved
                    )
                else:
                    uploaded = (
                        {}
                        if attach
                        else await uploads.upload_inputs(client, inputs or {}, on_sent=watch.moved)
                    )
                graph = wf.apply({**values, **uploaded})
                if attach and how == "temp":
                    # Posted earlier as this worker would have: its images are temp files
                    # (FramesLost if a worker configured otherwise sent them as frames).
                    savers = notrace.to_temp(graph, "")[1]
                    in_temp = True
                elif attach:
                    # Posted earlier, maybe by a worker configured otherwise: its images may
                    # come as frames or as files, whichever its savers were; both are taken.
                    savers = notrace.to_websocket(graph)[1]
                elif how == "temp":
                    graph, savers = notrace.to_temp(graph, uuid.uuid4().hex)
                    in_temp = True
                elif (
                    how == "memory"
                    and not keep_metadata
                    and await client.has_node(notrace.WEBSOCKET_SAVER)
                ):
                    # Kept metadata lives only in the files SaveImage writes: those are then
                    # written (and overwritten once downloaded).
                    graph, savers = notrace.to_websocket(graph)
                if savers and not in_temp:
                    collector = notrace.FrameCollector(
                        savers,
                        max_frame_bytes=client.limits.max_output_bytes,
                        max_files=client.limits.max_outputs,
                    )
                    on_event = _collecting(collector, client.name, on_event)
                run_started = time.perf_counter()
                watch.enter("run")
                if attach and prompt_id is not None:
                    live = how == "memory" and savers
                    follow = client.follow_live if live else client.follow
                    result = await follow(prompt_id, on_event=on_event)
                else:
                    result = await client.run(graph, prompt_id=pid, on_event=on_event)
        except TimeoutError as exc:
            if not timer.expired():
                raise
            if watch.phase == "run":
                await _stop_quietly(client, pid)
            raise watch.timed_out(client.name, timeout) from exc
        finished = True
        upload_seconds = run_started - fitted
        run_seconds = time.perf_counter() - run_started
        on_disk = list(result.outputs)  # a SaveImageWebsocket writes no file, lists none
        if how != "off":
            pending.extend(notrace.output_traces(on_disk))
        if on_ran is not None:
            await on_ran()
        result.raise_for_status()
        names: dict[results.OutputFile, str] = {}
        if in_temp:
            on_disk, names = notrace.temp_outputs(on_disk, savers, pid, client.name)

        download_started = time.perf_counter()
        try:
            from_frames = (
                collector.outputs(pid, client.name, saved={f.node_id for f in on_disk})
                if collector is not None
                else []
            )
        except notrace.FramesLost:
            if not attach:  # our own socket missed them: it may be deaf, take a new one
                await client.drop_socket()
            raise
        watch.enter("download")
        timer = asyncio.timeout_at(deadline)
        try:
            async with timer:
                downloaded = (
                    await downloads.download_outputs(
                        client,
                        _only(result, on_disk),
                        out_dir=out_dir,
                        on_received=watch.moved,
                        every=in_temp,
                    )
                    if on_disk
                    else ()
                )
        except TimeoutError as exc:
            if not timer.expired():
                raise
            raise watch.timed_out(client.name, timeout) from exc
        if names:  # delivered under the saver's prefix, not ComfyUI's temp name
            downloaded = tuple(
                dataclasses.replace(
                    item, file=dataclasses.replace(item.file, filename=names[item.file])
                )
                if item.file in names
                else item
                for item in downloaded
            )
        files = tuple(OutputData(f, d) for f, d in from_frames) + downloaded
        if not keep_metadata:
            files = tuple([await downloads.without_metadata(f, client.name) for f in files])
        return Outcome(
            result=result,
            files=files,
            upload_seconds=upload_seconds,
            run_seconds=run_seconds,
            download_seconds=time.perf_counter() - download_started,
            uploaded=uploaded,
            fit_seconds=fitted - started,
        )
    except asyncio.CancelledError:
        how = "off"  # it may still run: its traces stay written down for a successor
        raise
    except errors.ComfyError as exc:
        # After a transient error the prompt may still run there, or its images still wait
        # there, and the retry re-attaches to it: its traces stay written down (the sweep
        # removes them once the job ends). A permanent one (a refused workflow, a timeout)
        # ends the job: clean up now.
        if exc.transient and (not finished or in_temp):
            how = "off"
        raise
    finally:
        if how != "off":
            if cleanup is not None:
                cleanup.append(Cleanup(pid, tuple(pending), finished))
            else:
                await _scrub(client, pid, pending, finished=finished, traces=traces)


async def clean_up(
    client: comfy_client.ComfyClient, left: Cleanup, traces: notrace.TraceLog | None
) -> None:
    """Remove what a job left on the backend (see `execute`'s `cleanup`)."""
    await _scrub(client, left.prompt_id, list(left.pending), finished=left.finished, traces=traces)


def _only(result: results.RunResult, files: list[results.OutputFile]) -> results.RunResult:
    return dataclasses.replace(result, outputs=tuple(files))


def _collecting(
    collector: notrace.FrameCollector, backend: str, on_event: EventCallback | None
) -> EventCallback:
    async def collect(event: events.Event) -> None:
        collector.feed(event, backend)
        if on_event is not None:
            outcome = on_event(event)
            if inspect.isawaitable(outcome):
                await outcome

    return collect


async def _scrub(
    client: comfy_client.ComfyClient,
    prompt_id: str,
    pending: list[notrace.Trace],
    *,
    finished: bool,
    traces: notrace.TraceLog | None,
) -> None:
    """Remove what the job left on the backend; what cannot be removed now stays
    written down (`traces`) for the next sweep."""
    files = [t for t in pending if t.kind != "history"]
    try:
        gone = await notrace.scrub(client, prompt_id, files, finished=finished)
    except errors.ComfyError as exc:
        logger.info(
            "could not clean up after a job on backend %s: %s",
            client.name,
            exc,
            extra={"action": "scrub_failed"},
        )
        return
    if traces is not None and gone:
        try:
            await traces.gone(client.name, gone)
        except Exception as exc:  # the job's own outcome matters more; the sweep retries
            logger.info(
                "could not strike out a job's traces: %s", exc, extra={"action": "traces_unsaved"}
            )


async def _stop_quietly(client: comfy_client.ComfyClient, prompt_id: str) -> None:
    try:
        await client.cancel(prompt_id)
    except errors.ComfyError:
        pass  # the backend is gone or busy; the timeout message says enough
