"""One workflow run on one backend: upload inputs, submit, follow, download outputs.

Shared by `comfyveil generate`, the worker and the benchmark so the three follow the
same path. Input images are uploaded under a name derived from their content, never
the user's file name: the backend learns nothing from it, and the same image sent
twice is stored once (ComfyUI deduplicates by name and hash).

One deadline covers the whole job, upload, run and download, so a backend that
trickles its answer or stops reading ends the job in time; the outputs one job may
bring back are capped in number and bytes (`[limits]`), and file names a backend
sends never choose where a file lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal

from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import errors, events, results, workflow

EventCallback = Callable[[events.Event], Awaitable[None] | None]
RanCallback = Callable[[], Awaitable[None]]

_MIME_EXT = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp", "image/gif": ".gif"}
_UNSAFE = re.compile(r"[^\w.\- ]+")
STALLED = 2.0  # seconds without a byte moving after which a phase counts as stalled
Phase = Literal["upload", "run", "download"]


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
) -> tuple[OutputData, ...]:
    """Fetch the files a finished run saved (temp previews are skipped): into memory, or
    with `out_dir` streamed into that folder (see `save_stream`).

    One file at a time, so a job holds at most max_output_bytes, and an oversized or
    stalled file stops the rest. Raises TooManyOutputs before fetching anything when the
    run lists more than max_outputs files, OutputTooLarge past max_output_bytes.
    """
    wanted = [f for f in result.outputs if f.type == "output"] or list(result.outputs)
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
) -> Outcome:
    """Run `wf` with validated `values` on `client`'s backend and download the outputs.

    With `attach=True` the prompt was submitted earlier (by a worker that died) and is
    followed by id instead of being submitted again, so the GPU work is not paid twice.
    `on_ran` is awaited once the backend is done with the prompt, before the outputs
    are downloaded: from then on its GPU can take the next job, however slow the link
    that carries the files back. `timeout` covers the upload, the run and the download
    together. With `out_dir` the outputs are streamed into that folder, never held in
    memory (`OutputData.path`).

    Raises:
        ComfyError: the backend refused, failed, was interrupted or took too long.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    watch = _Watch()
    started = time.perf_counter()
    run_started = started
    timer = asyncio.timeout_at(deadline)
    try:
        async with timer:
            uploaded = (
                {} if attach else await upload_inputs(client, inputs or {}, on_sent=watch.moved)
            )
            graph = wf.apply({**values, **uploaded})
            run_started = time.perf_counter()
            watch.enter("run")
            if attach and prompt_id is not None:
                result = await client.follow(prompt_id, on_event=on_event)
            else:
                result = await client.run(graph, prompt_id=prompt_id, on_event=on_event)
    except TimeoutError as exc:
        if not timer.expired():
            raise
        if watch.phase == "run" and prompt_id is not None:
            await _stop_quietly(client, prompt_id)
        raise watch.timed_out(client.name, timeout) from exc
    upload_seconds = run_started - started
    run_seconds = time.perf_counter() - run_started
    if on_ran is not None:
        await on_ran()
    result.raise_for_status()

    download_started = time.perf_counter()
    watch.enter("download")
    timer = asyncio.timeout_at(deadline)
    try:
        async with timer:
            files = await download_outputs(
                client, result, out_dir=out_dir, on_received=watch.moved
            )
    except TimeoutError as exc:
        if not timer.expired():
            raise
        raise watch.timed_out(client.name, timeout) from exc
    return Outcome(
        result=result,
        files=files,
        upload_seconds=upload_seconds,
        run_seconds=run_seconds,
        download_seconds=time.perf_counter() - download_started,
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
        elif isinstance(event, events.Progress) and event.max:
            kind = self._node_types.get(event.node or "", "")
            percent = 100 * event.value / event.max
            self._show(f"{kind or 'node'} step {event.value:g}/{event.max:g} ({percent:.0f}%)")
        elif isinstance(event, events.ExecutionSuccess):
            self._show("done")

    def close(self) -> None:
        if self._tty and self._last:
            self._stream.write("\n")
            self._stream.flush()
