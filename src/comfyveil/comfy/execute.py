"""One workflow run on one backend: upload inputs, submit, follow, download outputs.

Shared by `comfyveil generate`, the worker and the benchmark so the three follow the
same path. Input images are uploaded under a name derived from their content, never
the user's file name: the backend learns nothing from it, and the same image sent
twice is stored once (ComfyUI deduplicates by name and hash).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import errors, events, results, workflow

EventCallback = Callable[[events.Event], Awaitable[None] | None]
RanCallback = Callable[[], Awaitable[None]]

_MIME_EXT = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp", "image/gif": ".gif"}


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
    file: results.OutputFile
    data: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Outcome:
    result: results.RunResult
    files: tuple[OutputData, ...]
    upload_seconds: float
    run_seconds: float  # submit to done, as the caller saw it
    download_seconds: float


class JobTimedOut(errors.ComfyError):
    """The job took too long on the GPU and was stopped."""


async def upload_inputs(
    client: comfy_client.ComfyClient, inputs: Mapping[str, InputImage]
) -> dict[str, str]:
    """Upload each input image; returns parameter name -> the name to put in the graph."""
    names: dict[str, str] = {}
    for param, image in inputs.items():
        uploaded = await client.upload_image(image.data, image.upload_name)
        names[param] = uploaded.reference
    return names


async def download_outputs(
    client: comfy_client.ComfyClient, result: results.RunResult
) -> tuple[OutputData, ...]:
    """Fetch the files a finished run saved (temp previews are skipped)."""
    wanted = [f for f in result.outputs if f.type == "output"] or list(result.outputs)
    datas = await asyncio.gather(*(client.download(f) for f in wanted))
    return tuple(OutputData(f, d) for f, d in zip(wanted, datas, strict=True))


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
) -> Outcome:
    """Run `wf` with validated `values` on `client`'s backend and download the outputs.

    With `attach=True` the prompt was submitted earlier (by a worker that died) and is
    followed by id instead of being submitted again, so the GPU work is not paid twice.
    `on_ran` is awaited once the backend is done with the prompt, before the outputs
    are downloaded: from then on its GPU can take the next job, however slow the link
    that carries the files back.

    Raises:
        ComfyError: the backend refused, failed, was interrupted or took too long.
    """
    started = time.perf_counter()
    uploaded = {} if attach else await upload_inputs(client, inputs or {})
    upload_seconds = time.perf_counter() - started

    graph = wf.apply({**values, **uploaded})
    run_started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            if attach and prompt_id is not None:
                result = await client.follow(prompt_id, on_event=on_event)
            else:
                result = await client.run(graph, prompt_id=prompt_id, on_event=on_event)
    except TimeoutError as exc:
        if prompt_id is not None:
            await _stop_quietly(client, prompt_id)
        raise JobTimedOut(
            f"the job took longer than {timeout:.0f} s on backend {client.name} and was stopped",
            backend=client.name,
        ) from exc
    run_seconds = time.perf_counter() - run_started
    if on_ran is not None:
        await on_ran()
    result.raise_for_status()

    download_started = time.perf_counter()
    files = await download_outputs(client, result)
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


def save_outputs(files: tuple[OutputData, ...], out_dir: Path, *, prefix: str = "") -> list[Path]:
    """Write outputs into `out_dir` without overwriting anything already there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = []
    for item in files:
        name = Path(item.file.filename).name  # never trust a server-sent path
        target = out_dir / f"{prefix}{name}"
        counter = 1
        while target.exists():
            target = out_dir / f"{prefix}{Path(name).stem}-{counter}{Path(name).suffix}"
            counter += 1
        target.write_bytes(item.data)
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
