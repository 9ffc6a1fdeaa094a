"""One workflow run on one backend: upload inputs, submit, follow, download outputs.

Shared by `comfyveil generate`, the worker and the benchmark so the three follow the
same path. Input images are uploaded under a name derived from their content, never
the user's file name: the backend learns nothing from it, and the same image sent
twice is stored once (ComfyUI deduplicates by name and hash). With `no_trace` they go
to the backend's temp folder under a random name instead, so do the images (or, with
`no_trace = "memory"`, they come back over the WebSocket), and all of them are
overwritten and the history entry deleted when the job ends (`comfy.notrace`), or, for a
caller that must first store the result (`cleanup`), once it says so. Outputs lose
their metadata (`comfyveil.metadata`) unless asked not to. An input larger than the
workflow can use is scaled down to that size before it is sent (`fit_inputs`): over a
slow link a job's time is its bytes.

One deadline covers the whole job, upload, run and download, so a backend that
trickles its answer or stops reading ends the job in time; the outputs one job may
bring back are capped in number and bytes (`[limits]`), and file names a backend
sends never choose where a file lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import inspect
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal

from comfyveil import metadata
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import errors, events, fit, notrace, results, shrink, workflow

logger = logging.getLogger(__name__)

EventCallback = Callable[[events.Event], Awaitable[None] | None]
RanCallback = Callable[[], Awaitable[None]]

_MIME_EXT = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp", "image/gif": ".gif"}
_UNSAFE = re.compile(r"[^\w.\- ]+")
STALLED = 2.0  # seconds without a byte moving after which a phase counts as stalled
Phase = Literal["upload", "run", "download"]
_STRIP_IN_THREAD = 1 << 20  # bytes: a bigger output is stripped off the event loop


@dataclass(frozen=True, slots=True)
class InputImage:
    """An image to upload for one of the workflow's image parameters."""

    data: bytes = field(repr=False)
    mime: str = "image/png"

    @property
    def upload_name(self) -> str:
        digest = hashlib.sha256(self.data).hexdigest()[:24]
        return f"comfyveil-{digest}{_MIME_EXT.get(self.mime, '.png')}"


@dataclass(frozen=True, slots=True)
class OutputData:
    """One output: its bytes, or (streamed into a folder) the path it was saved at."""

    file: results.OutputFile
    data: bytes = field(default=b"", repr=False)
    path: Path | None = None


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


async def fit_inputs(
    wf: workflow.Workflow,
    values: Mapping[str, object],
    inputs: Mapping[str, InputImage],
    max_pixels: int,
) -> dict[str, InputImage]:
    """Each input at the largest size `wf` can use it at with these `values`, in the
    fewest bytes that change nothing it sees (`comfy.fit`, `comfy.shrink`); the caller's
    images (the user's originals, kept for a re-roll) are not changed."""
    graph = wf.apply({k: v for k, v in values.items() if k not in inputs})
    fitted: dict[str, InputImage] = {}
    for param, image in inputs.items():
        found = wf.params.get(param)
        need = fit.fit_for(graph, found) if found is not None else fit.Fit()
        smaller = await shrink.shrink_async(image.data, need, max_pixels=max_pixels)
        fitted[param] = image if smaller is None else InputImage(smaller.data, smaller.mime)
    return fitted


async def upload_inputs(
    client: comfy_client.ComfyClient,
    inputs: Mapping[str, InputImage],
    *,
    on_sent: Callable[[int], None] | None = None,
) -> dict[str, str]:
    """Upload each input image; returns parameter name -> the name to put in the graph."""
    names: dict[str, str] = {}
    for param, image in inputs.items():
        uploaded = await client.upload_image(image.data, image.upload_name, on_sent=on_sent)
        names[param] = uploaded.reference
    return names


async def upload_traceless(
    client: comfy_client.ComfyClient,
    inputs: Mapping[str, InputImage],
    names: Mapping[str, notrace.Trace],
    *,
    on_sent: Callable[[int], None] | None = None,
) -> dict[str, str]:
    """Upload each input into the backend's temp folder under its trace's name."""
    refs: dict[str, str] = {}
    for param, image in inputs.items():
        trace = names[param]
        data = await _stripped(image.data)
        await client.upload_image(data, trace.name, type=trace.folder, on_sent=on_sent)
        refs[param] = trace.reference
    return refs


class _Budget:
    """The bytes one job may still bring back: each file and all of them together stay
    within max_output_bytes."""

    def __init__(self, client: comfy_client.ComfyClient) -> None:
        self.limit = client.limits.max_output_bytes
        self.left = self.limit
        self.backend = client.name

    async def take(
        self,
        client: comfy_client.ComfyClient,
        file: results.OutputFile,
        on_received: Callable[[int], None] | None,
    ) -> Any:
        """The file's chunks, counted against the job's budget."""
        # aclosing: an oversized file closes its connection now, not when collected.
        async with contextlib.aclosing(client.stream(file, limit=self.limit)) as stream:
            async for chunk in stream:
                if len(chunk) > self.left:
                    raise errors.OutputTooLarge(self.limit, backend=self.backend, together=True)
                self.left -= len(chunk)
                if on_received is not None:
                    on_received(len(chunk))
                yield chunk


async def download_outputs(
    client: comfy_client.ComfyClient,
    result: results.RunResult,
    *,
    out_dir: Path | None = None,
    on_received: Callable[[int], None] | None = None,
    every: bool = False,
) -> tuple[OutputData, ...]:
    """Fetch the files a finished run saved (temp previews are skipped): into memory, or
    with `out_dir` streamed into that folder (see `save_stream`).

    One file at a time, so a job holds at most max_output_bytes, and an oversized or
    stalled file stops the rest. Raises TooManyOutputs before fetching anything when the
    run lists more than max_outputs files, OutputTooLarge past max_output_bytes.
    `every`: fetch every file listed, temp ones included.
    """
    wanted = (
        list(result.outputs)
        if every
        else [f for f in result.outputs if f.type == "output"] or list(result.outputs)
    )
    if len(wanted) > client.limits.max_outputs:
        raise errors.TooManyOutputs(len(wanted), client.limits.max_outputs, backend=client.name)
    budget = _Budget(client)
    files: list[OutputData] = []
    for file in wanted:
        async with contextlib.aclosing(budget.take(client, file, on_received)) as chunks:
            if out_dir is not None:
                path = await save_stream(file.filename, chunks, out_dir)
                files.append(OutputData(file, path=path))
            else:
                files.append(OutputData(file, b"".join([chunk async for chunk in chunks])))
    return tuple(files)


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
                    inputs = await fit_inputs(wf, values, inputs, client.limits.max_input_pixels)
                fitted = time.perf_counter()
                watch.enter("upload")  # the scaling moved no bytes: no stall until now
                if how != "off":
                    todo = {} if attach else dict(inputs or {})
                    names = {p: notrace.upload_trace(image.mime) for p, image in todo.items()}
                    fresh = [notrace.Trace("history", pid), *names.values()]
                    if traces is not None and not attach:
                        await traces.left(client.name, fresh)
                    pending.extend(t for t in fresh if t not in pending)
                    uploaded = await upload_traceless(client, todo, names, on_sent=watch.moved)
                else:
                    uploaded = (
                        {}
                        if attach
                        else await upload_inputs(client, inputs or {}, on_sent=watch.moved)
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
                    await download_outputs(
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
            files = tuple([await _without_metadata(f, client.name) for f in files])
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


async def _stripped(data: bytes) -> bytes:
    if len(data) > _STRIP_IN_THREAD:
        return await asyncio.to_thread(metadata.strip, data)
    return metadata.strip(data)


async def _without_metadata(item: OutputData, backend: str) -> OutputData:
    try:
        if item.path is not None:  # streamed to disk: stripped there
            await asyncio.to_thread(metadata.strip_path, item.path)
            return item
        return OutputData(item.file, await _stripped(item.data))
    except metadata.MetadataError as exc:
        if item.path is not None:
            item.path.unlink(missing_ok=True)  # possibly half blanked: nobody sees it
        raise errors.OutputDamaged(backend=backend) from exc


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


def safe_filename(filename: str) -> str:
    """A file name from a backend, reduced to one plain name inside a folder: no folder
    part (``../``, absolute, backslashes), no control characters, not too long."""
    base = PurePosixPath(filename.replace("\\", "/")).name
    base = _UNSAFE.sub("_", base).strip(" .")
    stem, dot, suffix = base.rpartition(".")
    if dot and len(suffix) <= 16 and len(base) > 120:
        base = f"{stem[:100]}.{suffix}"
    return base[:120] or "output"


def _create_new(out_dir: Path, name: str, prefix: str = "") -> tuple[Path, IO[bytes]]:
    """A new file in `out_dir` for `name`, never an existing one (nor a link's target)."""
    stem, suffix = Path(name).stem, Path(name).suffix
    counter = 0
    while True:
        target = out_dir / f"{prefix}{name if counter == 0 else f'{stem}-{counter}{suffix}'}"
        try:
            return target, target.open("xb")
        except FileExistsError:
            counter += 1


async def save_stream(filename: str, chunks: Any, out_dir: Path) -> Path:
    """Stream a file into `out_dir` under a safe, new name; a failed download leaves
    nothing behind."""
    await asyncio.to_thread(out_dir.mkdir, parents=True, exist_ok=True)
    target, handle = await asyncio.to_thread(_create_new, out_dir, safe_filename(filename))
    try:
        try:
            async for chunk in chunks:
                await asyncio.to_thread(handle.write, chunk)
        finally:
            handle.close()
    except BaseException:
        target.unlink(missing_ok=True)  # in the loop: it must happen even when cancelled
        raise
    return target


def save_outputs(files: tuple[OutputData, ...], out_dir: Path, *, prefix: str = "") -> list[Path]:
    """Write outputs into `out_dir` without overwriting anything already there; those
    already streamed there (`path`) are listed as they are."""
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = []
    for item in files:
        if item.path is not None:
            saved.append(item.path)
            continue
        target, handle = _create_new(out_dir, safe_filename(item.file.filename), prefix)
        with handle:
            handle.write(item.data)
        saved.append(target)
    return saved


def shows_steps(event: events.Progress, node_types: Mapping[str, str]) -> bool:
    """Whether a progress event is a step users can read (a sampler's 9/20), not a saver
    or preview node ticking once per image as it sends it ("SaveImage step 0/1")."""
    kind = node_types.get(event.node or "", "")
    return event.max > 1 and not kind.startswith(("Save", "Preview"))


class ProgressPrinter:
    """One status line on a terminal (stderr), rewritten as events arrive."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._last = ""
        self._node_types: dict[str, str] = {}

    def set_graph(self, graph: Mapping[str, Any]) -> None:
        self._node_types = {k: str(v.get("class_type", "")) for k, v in graph.items()}

    def _show(self, text: str) -> None:
        if text == self._last:
            return
        self._last = text
        if self._tty:
            self._stream.write("\r\x1b[2K" + text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.QueuePosition):
            where = "running" if event.position == 0 else f"queued #{event.position}"
            self._show(where)
        elif isinstance(event, events.ExecutionStart):
            self._show("started")
        elif isinstance(event, events.Executing) and event.node is not None:
            kind = self._node_types.get(event.node, "")
            self._show(f"node {event.node} {kind}".rstrip())
        elif isinstance(event, events.Progress) and shows_steps(event, self._node_types):
            kind = self._node_types.get(event.node or "", "")
            percent = 100 * event.value / event.max
            self._show(f"{kind or 'node'} step {event.value:g}/{event.max:g} ({percent:.0f}%)")
        elif isinstance(event, events.ExecutionSuccess):
            self._show("done")

    def close(self) -> None:
        if self._tty and self._last:
            self._stream.write("\n")
            self._stream.flush()
