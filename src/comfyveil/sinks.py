"""Where finished jobs go: delivery sinks.

A worker hands every finished job (succeeded, failed or cancelled) to each of its sinks,
then records the delivery in the database (`deliveries`), so a result reaches a sink
once even when a worker dies between "done" and "delivered": the next worker finds the
job undelivered and hands it over again. A sink should therefore tolerate seeing a job a
second time after a crash (FileSink simply writes the same files again).

A delivery that fails is tried again later, a bounded number of times (fewer when the
sink raises `Undeliverable`: the destination said no), then recorded as failed; it never
holds up the delivery of other jobs. One that failed because the destination was down
(`Unreachable`) is tried again as soon as the sink says it is back (an optional `back()`
coroutine that returns when it next is), not after the delay its failures earned. A
sink may also decline a job outright (an optional `accepts(job)` method): the Telegram
sink takes no job queued without a chat.

The Telegram front end adds its own sink (send the photo, edit the status message);
`FileSink` writes outputs into a folder, like `comfyveil generate --out`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol, runtime_checkable

from comfyveil.errors import ComfyveilError
from comfyveil.store import jobs

_UNSAFE = re.compile(r"[^A-Za-z0-9._ -]+")


class Undeliverable(ComfyveilError):
    """The destination refused the result (the chat is gone, the bot was blocked or
    removed): tried again a few times in case it changes, then given up."""


class Unreachable(ComfyveilError):
    """The destination could not be reached (an outage): tried again after the usual
    delay, or as soon as the sink says it is back (an optional `back()` method)."""


@runtime_checkable
class DeliverySink(Protocol):
    """Something that takes a finished job's result to its user."""

    @property
    def name(self) -> str:
        """A stable name, recorded with each delivery (e.g. "telegram", "files")."""
        ...

    async def deliver(self, job: jobs.Job, outputs: Sequence[jobs.Output]) -> None:
        """Deliver a finished job. `outputs` is empty unless the job succeeded.

        Raise to have the delivery tried again later (a bounded number of times; raise
        `Undeliverable` when the destination refused it).
        """
        ...


def safe_name(filename: str) -> str:
    """A file name from a backend, reduced to something safe to create locally."""
    base = PurePosixPath(filename.replace("\\", "/")).name
    base = _UNSAFE.sub("_", base).strip(" .")
    return base or "output"


def output_path(out_dir: Path, job: jobs.Job, output: jobs.Output) -> Path:
    """Where FileSink (and `comfyveil submit --out`) puts one output: COMMAND-JOBID-INDEX
    with the file's extension. The name the backend gave says nothing (with no trace,
    ``ComfyUI_temp_ornuo_00001_.png``); this one is known before the job ends."""
    suffix = PurePosixPath(safe_name(output.filename)).suffix
    suffix = suffix if len(suffix) <= 16 else ""
    return out_dir / f"{safe_name(job.command)}-{job.id}-{output.index + 1}{suffix}"


def write_outputs(out_dir: Path, job: jobs.Job, outputs: Sequence[jobs.Output]) -> list[Path]:
    """Write outputs atomically (temp file, then rename); the paths written. Blocking."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for output in outputs:
        path = output_path(out_dir, job, output)
        tmp = path.with_name(f".{path.name}.part")
        tmp.write_bytes(output.data)
        tmp.replace(path)
        written.append(path)
    return written


class FileSink:
    """Writes each succeeded job's outputs into `out_dir` as COMMAND-JOBID-INDEX.EXT."""

    def __init__(self, out_dir: Path, *, name: str = "files") -> None:
        self.out_dir = Path(out_dir)
        self._name = name
        self.delivered: list[Path] = []  # every path written by this sink, in order

    @property
    def name(self) -> str:
        return self._name

    async def deliver(self, job: jobs.Job, outputs: Sequence[jobs.Output]) -> None:
        if job.status is not jobs.Status.SUCCEEDED or not outputs:
            return
        paths = await asyncio.to_thread(write_outputs, self.out_dir, job, outputs)
        self.delivered.extend(paths)
