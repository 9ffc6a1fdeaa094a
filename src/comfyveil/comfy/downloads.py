"""A finished run's outputs brought back from its backend: one file at a time, capped in
number and bytes (`[limits]`), into memory or streamed into a folder, their metadata off
unless asked not to; and written into a folder under safe, new names, so a file name a
backend sends never chooses where a file lands."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from comfyveil import metadata
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import errors, results
from comfyveil.comfy.uploads import stripped

_UNSAFE = re.compile(r"[^\w.\- ]+")


@dataclass(frozen=True, slots=True)
class OutputData:
    """One output: its bytes, or (streamed into a folder) the path it was saved at."""

    file: results.OutputFile
    data: bytes = field(default=b"", repr=False)
    path: Path | None = None


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


async def without_metadata(item: OutputData, backend: str) -> OutputData:
    try:
        if item.path is not None:  # streamed to disk: stripped there
            await asyncio.to_thread(metadata.strip_path, item.path)
            return item
        return OutputData(item.file, await stripped(item.data))
    except metadata.MetadataError as exc:
        if item.path is not None:
            item.path.unlink(missing_ok=True)  # possibly half blanked: nobody sees it
        raise errors.OutputDamaged(backend=backend) from exc


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
