"""Leaving nothing of a job on the GPU host (DESIGN.md §10).

Three things of a user's would stay on a ComfyUI server after a job: the output files in
`output/` (and `temp/` for previews), the uploaded inputs in `input/`, and the prompt in
`/history`. For a backend with `no_trace` (the default, `true` or `"temp"`):

- **Outputs go to its temp folder** and stay there only until the result is stored in
  the database. Every `SaveImage` and `PreviewImage` node becomes a `PreviewImage`
  (`to_temp`), which writes into `temp/` under a name ComfyUI draws at random
  (`ComfyUI_temp_xxxxx_00001_.png`), fetched with `GET /view?type=temp` like any file.
  A worker that dies at any moment leaves them where its successor finds them (the
  prompt's history entry lists them), so a job is never run twice for lack of its
  images; they are overwritten with a 1x1 image, and the history entry deleted, once
  the result is home. Each saver also gets an input ComfyUI does not read but does hash
  into its cache key, fresh for each prompt: a re-run of the same prompt runs its savers
  again instead of naming the files (overwritten by then) of the earlier run.
  The GPU-host guide puts `temp/` on a tmpfs (`--temp-directory`), so they never touch a
  disk either.
- **Or outputs never touch any disk** (`no_trace = "memory"`, an operator's choice): each
  saver becomes a
  `SaveImageWebsocket` (shipped with ComfyUI in `custom_nodes/websocket_image_save.py`):
  it encodes each image as a PNG and sends it as a binary WebSocket frame, type 4
  `[u32 4][u32 json_len][json with node_id, prompt_id][png]` to a client that negotiated
  `supports_preview_metadata` (ours does), type 1 `[u32 1][u32 2][png]` to others, one
  frame per image with a `progress` event whose `max` is the batch size (notes §8). A
  type-1 frame names no node: it belongs to the node of the last `executing` event.
  The frames go only to the socket of the worker that posted the prompt: if that worker
  dies and no successor has taken its socket id over before the savers run, they are
  lost and the prompt runs again (paid twice).
  Output nodes with no in-memory equivalent (video savers) still write a file; it is
  overwritten with a 1x1 image once it has been downloaded.
- **Inputs go to `temp/`, not `input/`,** under a random name, referenced as
  `name [temp]` (LoadImage resolves annotated names, `folder_paths.annotated_filepath`),
  and are overwritten with a 1x1 image when the job ends. ComfyUI empties `temp/` on
  every start, so an input a crash left behind is gone at the server's next restart.
  No route of ComfyUI 0.3.64 loads an image without a file, so the bytes do reach its
  disk for the duration of the job.
- **The history entry is deleted** (`POST /history {"delete": [id]}`) once the outputs are
  home, after a failure or a cancel too (once the prompt has left the queue).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal, Protocol

from comfyveil.comfy import errors, events
from comfyveil.comfy.results import OutputFile

Mode = Literal["off", "temp", "memory"]

__all__ = [
    "MAX_FRAME_BYTES",
    "FrameCollector",
    "FramesLost",
    "Mode",
    "Trace",
    "TraceLog",
    "file_writers",
    "mode",
    "scrub",
    "to_temp",
    "to_websocket",
]

# What the images of one job may weigh unless told (`[limits] max_output_bytes`, which
# `execute` passes; the socket's own cap for a binary frame sits just above it).
MAX_FRAME_BYTES = 512 << 20
WEBSOCKET_SAVER = "SaveImageWebsocket"
TEMP_SAVER = "PreviewImage"
# The input `to_temp` adds to each saver: ComfyUI ignores inputs a node does not declare
# but includes every input in the node's cache key (comfy_execution/caching.py).
RUN_INPUT = "comfyveil_run"
FILE_SAVERS = frozenset({"SaveImage", "PreviewImage"})
# Output nodes that write files and have no in-memory equivalent in ComfyUI.
_KNOWN_WRITERS = frozenset(
    {
        "SaveVideo",
        "SaveWEBM",
        "SaveAnimatedWEBP",
        "SaveAnimatedPNG",
        "SaveAudio",
        "SaveAudioMP3",
        "SaveAudioOpus",
        "SaveGLB",
        "SaveLatent",
        "VHS_VideoCombine",
    }
)
# A valid 1x1 black PNG: what an overwritten file holds afterwards.
PLACEHOLDER_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010800000000"
    "3a7e9b550000000a49444154789c63600000000200014873a9de0000000049454e44ae426082"
)
SCRUB_WAIT = 30.0  # seconds a cancelled prompt may take to leave the queue
_SCRUB_POLL = 0.25  # seconds between two looks at the queue meanwhile
_FILE_KEYS = ("images", "gifs", "videos", "audio")  # where an output node lists its files


class FramesLost(errors.ComfyError):
    """The job ran, but its images were sent to a WebSocket that was gone."""

    transient = True

    def __init__(self, prompt_id: str, *, backend: str) -> None:
        self.prompt_id = prompt_id
        super().__init__(
            f"the images of the job on backend {backend} were lost on the way back",
            backend=backend,
        )


@dataclass(frozen=True, slots=True)
class Trace:
    """Something of a job's on a backend: its history entry, or a file there."""

    kind: Literal["history", "input", "output"]
    name: str  # the prompt id, or the file's name
    folder: str = ""  # input, temp or output: the file's type on the backend
    subfolder: str = ""

    @property
    def reference(self) -> str:
        """A file's name as LoadImage reads it: annotated with its folder."""
        path = f"{self.subfolder}/{self.name}" if self.subfolder else self.name
        return f"{path} [{self.folder}]"


class TraceLog(Protocol):
    """Where a job's traces are written down before they are left on a backend, so that
    whoever comes after a crash, a `/forget` or the retention purge can remove them."""

    async def left(self, backend: str, traces: Sequence[Trace]) -> None: ...

    async def gone(self, backend: str, traces: Sequence[Trace]) -> None: ...


def upload_trace(mime: str) -> Trace:
    """A fresh random name in temp/ for one input: nothing of its content shows in it."""
    ext = {"image/jpeg": ".jpg", "image/webp": ".webp"}.get(mime, ".png")
    return Trace("input", f"comfyveil-{uuid.uuid4().hex}{ext}", "temp")


def mode(no_trace: bool | str) -> Mode:
    """The no-trace mode a backend's `no_trace` setting names (True is "temp")."""
    if no_trace is True or no_trace == "temp":
        return "temp"
    if no_trace == "memory":
        return "memory"
    return "off"


def _swap_savers(
    graph: Mapping[str, Any], saver: Callable[[Mapping[str, Any]], dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The graph with every image saver made `saver(its inputs)`, and for each of those
    nodes the file name prefix its images get (`comfyveil/f` -> `f`)."""
    out: dict[str, Any] = dict(graph)
    replaced: dict[str, str] = {}
    for node_id, node in graph.items():
        if not isinstance(node, Mapping) or node.get("class_type") not in FILE_SAVERS:
            continue
        inputs = node.get("inputs") or {}
        prefix = PurePosixPath(str(inputs.get("filename_prefix") or "ComfyUI")).name
        out[node_id] = saver(inputs)
        replaced[str(node_id)] = prefix or "ComfyUI"
    return out, replaced


def to_temp(graph: Mapping[str, Any], run: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The graph with every image saver made a PreviewImage (temp folder, random name),
    marked with `run` so no cache answers for it, and for each of those nodes the file
    name prefix its images get (`comfyveil/f` -> `f`)."""
    return _swap_savers(
        graph,
        lambda inputs: {
            "class_type": TEMP_SAVER,
            "inputs": {"images": inputs.get("images"), RUN_INPUT: run},
        },
    )


def temp_outputs(
    files: Sequence[OutputFile], savers: Mapping[str, str], prompt_id: str, backend: str
) -> tuple[list[OutputFile], dict[OutputFile, str]]:
    """The files of a run to bring home: those of the savers `to_temp` made (each with the
    name it is delivered under) and those other output nodes wrote. FramesLost when a
    saver listed none (the prompt was posted with its images over a WebSocket)."""
    named: dict[OutputFile, str] = {}
    counts: dict[str, int] = {}
    for f in files:
        if f.node_id in savers:
            counts[f.node_id] = counts.get(f.node_id, 0) + 1
            suffix = PurePosixPath(f.filename).suffix or ".png"
            named[f] = f"{savers[f.node_id]}_{counts[f.node_id]:05}_{suffix}"
    if any(counts.get(node, 0) == 0 for node in savers):
        raise FramesLost(prompt_id, backend=backend)
    wanted = [f for f in files if f in named or f.type == "output"]
    return wanted, named


def to_websocket(graph: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The graph with every image saver made a SaveImageWebsocket, and for each of those
    nodes the file name prefix its images get (`comfyveil/f` -> `f`)."""
    return _swap_savers(
        graph,
        lambda inputs: {"class_type": WEBSOCKET_SAVER, "inputs": {"images": inputs.get("images")}},
    )


def file_writers(graph: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(node id, class) of the output nodes that write a file `to_websocket` cannot avoid."""
    found = []
    for node_id, node in graph.items():
        class_type = str(node.get("class_type", "")) if isinstance(node, Mapping) else ""
        if class_type in _KNOWN_WRITERS or (
            class_type.startswith("Save")
            and class_type not in FILE_SAVERS
            and class_type != WEBSOCKET_SAVER
        ):
            found.append((str(node_id), class_type))
    return found


@dataclass
class FrameCollector:
    """Picks the images of the SaveImageWebsocket nodes out of a prompt's events.

    A frame is attributed to the node its metadata names (type 4), else to the node of the
    last `executing` event (type 1 names none). Frames of other nodes (a sampler's latent
    previews) are ignored. `progress` of a saver node says how many images it sends.
    """

    nodes: Mapping[str, str]  # node id -> file name prefix
    max_frame_bytes: int = MAX_FRAME_BYTES  # each image, and all of them together
    max_files: int = 64
    frames: list[tuple[str, bytes]] = field(default_factory=list)
    expected: dict[str, int] = field(default_factory=dict)
    _current: str | None = None
    _bytes: int = 0

    def feed(self, event: events.Event, backend: str) -> None:
        if isinstance(event, events.Executing):
            self._current = event.node
        elif isinstance(event, events.Progress) and event.node in self.nodes:
            self.expected[event.node] = max(self.expected.get(event.node, 0), int(event.max))
        elif isinstance(event, events.Preview):
            node = event.node_id or self._current
            if node not in self.nodes:
                return
            if len(event.image) > self.max_frame_bytes:
                raise errors.OutputTooLarge(self.max_frame_bytes, backend=backend)
            self._bytes += len(event.image)
            if self._bytes > self.max_frame_bytes:
                raise errors.OutputTooLarge(self.max_frame_bytes, backend=backend, together=True)
            if len(self.frames) >= self.max_files:
                raise errors.TooManyOutputs(len(self.frames) + 1, self.max_files, backend=backend)
            self.frames.append((node, event.image))

    def outputs(
        self, prompt_id: str, backend: str, *, saved: Collection[str] = ()
    ) -> list[tuple[OutputFile, bytes]]:
        """Each image as an output file; FramesLost when a saver's images did not all come
        (a node in `saved` wrote files instead: a prompt posted without no trace)."""
        counts: dict[str, int] = {}
        for node, _ in self.frames:
            counts[node] = counts.get(node, 0) + 1
        for node in self.nodes:
            if node in saved:
                continue
            if counts.get(node, 0) < max(1, self.expected.get(node, 0)):
                raise FramesLost(prompt_id, backend=backend)
        seen: dict[str, int] = {}
        files = []
        for node, data in self.frames:
            if node in saved:
                continue
            seen[node] = seen.get(node, 0) + 1
            name = f"{self.nodes[node]}_{seen[node]:05}_.png"
            file = OutputFile(node, name, "", "websocket", "image")
            files.append((file, data))
        return files


def output_traces(files: Sequence[OutputFile]) -> list[Trace]:
    """The files a run left in the backend's folders (not those that came as frames)."""
    return [
        Trace("output", f.filename, f.type, f.subfolder)
        for f in files
        if f.type in ("output", "temp")
    ]


async def scrub(
    client: Any,
    prompt_id: str | None,
    files: Sequence[Trace],
    *,
    finished: bool = False,
    wait: float = SCRUB_WAIT,
) -> list[Trace]:
    """Overwrite `files` on the backend and delete the prompt's history entry; the traces
    that are gone.

    A prompt seen to finish (`finished`) costs one request per file plus one. Otherwise
    the prompt must leave the queue first (a cancelled one is waited for, up to
    SCRUB_WAIT: a running prompt has no history entry yet), and its history entry names
    the output files it left, which are overwritten too.
    """
    gone: list[Trace] = []
    entry: Mapping[str, Any] | None = None
    if prompt_id is not None and not finished:
        if not await _left_queue(client, prompt_id, wait):
            # Still running: its inputs are still being read. Nothing is touched now;
            # the traces stay written down for the next sweep.
            return gone
        entry = await client.history(prompt_id)
    targets = list(files)
    if entry is not None:
        listed = {(t.folder, t.subfolder, t.name) for t in targets}
        for node_output in (entry.get("outputs") or {}).values():
            if not isinstance(node_output, Mapping):
                continue
            listed_files = [item for key in _FILE_KEYS for item in (node_output.get(key) or ())]
            for item in listed_files:
                if not isinstance(item, Mapping) or not item.get("filename"):
                    continue
                trace = Trace(
                    "output",
                    str(item["filename"]),
                    str(item.get("type") or "output"),
                    str(item.get("subfolder") or ""),
                )
                if trace.folder in ("output", "temp") and (
                    (trace.folder, trace.subfolder, trace.name) not in listed
                ):
                    targets.append(trace)
    results = await asyncio.gather(
        *(_overwrite(client, t) for t in targets), return_exceptions=True
    )
    for trace, result in zip(targets, results, strict=True):
        if result is None:
            gone.append(trace)
        elif not isinstance(result, errors.ComfyError):
            raise result  # a bug, not a backend problem
    # The history entry is the only record of the output files' names: it goes only
    # once they are all overwritten, else the next sweep could not find them.
    if prompt_id is not None and len(gone) == len(targets):
        await client.delete_history([prompt_id])
        gone.append(Trace("history", prompt_id))
    return gone


async def _overwrite(client: Any, trace: Trace) -> None:
    # `overwrite` replaces the file under its own name; without it ComfyUI would keep
    # the user's file and write "name (1).png" beside it.
    await client.upload_image(
        PLACEHOLDER_PNG, trace.name, subfolder=trace.subfolder, type=trace.folder, overwrite=True
    )


async def _left_queue(client: Any, prompt_id: str, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while (await client.queue()).position(prompt_id) is not None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(_SCRUB_POLL)
    return True
