"""An asyncio client for one ComfyUI backend: HTTP (`comfy.transport`), events over WebSocket.

One `ComfyClient` talks to one backend. It keeps one WebSocket (one client_id) and
routes events to every job running through it, so a pool can run a job and have the
next one waiting on the same backend. Foreign errors are translated here, once, into
`comfy.errors`; nothing else in comfyveil sees aiohttp or websockets exceptions.

Privacy: no Origin header is ever sent (ComfyUI answers 403 to a foreign one), the
environment's proxy variables are ignored, and a SOCKS proxy URL is used for HTTP and
the WebSocket alike with host names resolved by the proxy (socks5h), so `.anon`
addresses work and no DNS query leaves this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import TracebackType
from typing import Any, Literal

import aiohttp
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from comfyveil.comfy import errors, events, transport

__all__ = [
    "ComfyClient",
    "OutputFile",
    "ProgressSample",
    "QueueItem",
    "QueueState",
    "RunResult",
    "Submitted",
    "Timings",
    "UploadedFile",
]

log = logging.getLogger(__name__)

POLL_INTERVAL = 1.0  # seconds between /queue + /history checks when no events can come
CHECK_INTERVAL = 15.0  # seconds of socket silence before checking the job still exists
POSITION_GRACE = 0.25  # seconds a submitted prompt may take to start before its place is asked
STREAM_CHUNK = 1 << 20  # bytes handed on at a time from a downloading output

EventCallback = Callable[[events.Event], Awaitable[None] | None]

_VIDEO_EXT = {".mp4", ".webm", ".mov", ".mkv", ".avi", ".gif"}
_IMAGE_EXT = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"}


# --- records ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submitted:
    prompt_id: str
    number: float
    node_errors: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OutputFile:
    node_id: str
    filename: str
    subfolder: str
    type: str
    kind: Literal["image", "video", "other"]

    @classmethod
    def classify(cls, node_id: str, item: Mapping[str, Any]) -> OutputFile:
        filename = str(item.get("filename", ""))
        ext = PurePosixPath(filename).suffix.lower()
        kind: Literal["image", "video", "other"] = (
            "video" if ext in _VIDEO_EXT else "image" if ext in _IMAGE_EXT else "other"
        )
        return cls(
            node_id=node_id,
            filename=filename,
            subfolder=str(item.get("subfolder") or ""),
            type=str(item.get("type") or "output"),
            kind=kind,
        )


@dataclass(frozen=True, slots=True)
class UploadedFile:
    name: str
    subfolder: str
    type: str

    @property
    def reference(self) -> str:
        """The value to put in a LoadImage `image` input."""
        return f"{self.subfolder}/{self.name}" if self.subfolder else self.name


@dataclass(frozen=True, slots=True)
class QueueItem:
    number: float
    prompt_id: str
    prompt: Mapping[str, Any] = field(repr=False)
    extra_data: Mapping[str, Any] = field(repr=False)
    outputs_to_execute: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueState:
    running: tuple[QueueItem, ...]
    pending: tuple[QueueItem, ...]  # in execution order (sorted by number)

    def position(self, prompt_id: str) -> int | None:
        """0 = running, 1 = next to run, ...; None = not in the queue."""
        if any(item.prompt_id == prompt_id for item in self.running):
            return 0
        for index, item in enumerate(self.pending, start=1):
            if item.prompt_id == prompt_id:
                return index
        return None


@dataclass(frozen=True, slots=True)
class ProgressSample:
    at: float  # time.monotonic() seconds
    node: str | None
    value: float
    max: float


@dataclass(frozen=True, slots=True)
class Timings:
    execution_start_ms: int | None = None
    execution_end_ms: int | None = None
    node_ms: Mapping[str, float] = field(default_factory=dict)  # cached nodes: 0
    cached_nodes: tuple[str, ...] = ()
    progress: tuple[ProgressSample, ...] = ()

    @property
    def duration_ms(self) -> int | None:
        if self.execution_start_ms is None or self.execution_end_ms is None:
            return None
        return self.execution_end_ms - self.execution_start_ms

    def iterations_per_second(self, node: str | None = None) -> float | None:
        """Rate of progress steps of one node (default: the one with most samples)."""
        by_node: dict[str | None, list[ProgressSample]] = {}
        for sample in self.progress:
            by_node.setdefault(sample.node, []).append(sample)
        if not by_node:
            return None
        if node is None:
            node = max(by_node, key=lambda k: len(by_node[k]))
        samples = by_node.get(node) or []
        if len(samples) < 2:
            return None
        steps = samples[-1].value - samples[0].value
        elapsed = samples[-1].at - samples[0].at
        return steps / elapsed if elapsed > 0 and steps > 0 else None


@dataclass(frozen=True, slots=True)
class RunResult:
    prompt_id: str
    backend: str
    status: Literal["success", "error", "interrupted"]
    outputs: tuple[OutputFile, ...] = ()
    ui: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # node -> raw output
    error: events.ExecutionError | None = None
    interruption: events.ExecutionInterrupted | None = None
    timings: Timings = field(default_factory=Timings)

    def raise_for_status(self) -> RunResult:
        """Return self on success; raise ExecutionFailed or Interrupted otherwise."""
        if self.status == "interrupted":
            info = self.interruption
            raise errors.Interrupted(
                backend=self.backend,
                prompt_id=self.prompt_id,
                node_id=info.node_id if info else None,
                node_type=info.node_type if info else None,
            )
        if self.status == "error":
            err = self.error
            raise errors.ExecutionFailed(
                backend=self.backend,
                prompt_id=self.prompt_id,
                node_id=err.node_id if err else None,
                node_type=err.node_type if err else None,
                exception_type=err.exception_type if err else None,
                exception_message=err.exception_message if err else "",
            )
        return self


# --- event tracking -------------------------------------------------------------------


class _Tracker:
    """Folds the events of one prompt into a RunResult."""

    def __init__(self, prompt_id: str, backend: str) -> None:
        self.prompt_id = prompt_id
        self.backend = backend
        self.started = False
        self.start_ms: int | None = None
        self.end_ms: int | None = None
        self.cached: tuple[str, ...] = ()
        self.node_ms: dict[str, float] = {}
        self.progress: list[ProgressSample] = []
        self.ui: dict[str, dict[str, Any]] = {}
        self.error: events.ExecutionError | None = None
        self.interruption: events.ExecutionInterrupted | None = None
        self.success = False
        self.done = False
        self._current: tuple[str, float] | None = None

    def _close_node(self, now: float) -> None:
        if self._current is not None:
            node, since = self._current
            self.node_ms[node] = self.node_ms.get(node, 0.0) + (now - since) * 1000.0
            self._current = None

    def feed(self, event: events.Event, now: float | None = None) -> None:
        """Fold one event in; `now` is when it arrived (monotonic), so node times do not
        depend on how quickly the consumer got round to it."""
        now = time.monotonic() if now is None else now
        match event:
            case events.ExecutionStart():
                self.started = True
                self.start_ms = event.timestamp
            case events.ExecutionCached():
                self.started = True
                self.cached = event.nodes
                for node in event.nodes:
                    self.node_ms.setdefault(node, 0.0)
            case events.Executing(node=None):
                self._close_node(now)
                if event.prompt_id == self.prompt_id:
                    self.done = True
            case events.Executing():
                self.started = True
                self._close_node(now)
                assert event.node is not None
                self._current = (event.node, now)
            case events.Executed():
                self.ui[event.node] = dict(event.output)
                if self._current and self._current[0] == event.node:
                    self._close_node(now)
                self.node_ms.setdefault(event.node, 0.0)
            case events.ProgressState():
                if self._current is not None:
                    state = event.nodes.get(self._current[0])
                    if state is not None and state.state == "finished":
                        self._close_node(now)
            case events.Progress():
                self.progress.append(ProgressSample(now, event.node, event.value, event.max))
            case events.ExecutionSuccess():
                self._close_node(now)
                self.success = True
                self.end_ms = event.timestamp
            case events.ExecutionError():
                self._close_node(now)
                self.error = event
                self.end_ms = event.timestamp
            case events.ExecutionInterrupted():
                self._close_node(now)
                self.interruption = event
                self.end_ms = event.timestamp
            case _:
                pass

    def result(self) -> RunResult:
        status: Literal["success", "error", "interrupted"] = (
            "interrupted" if self.interruption else "error" if self.error else "success"
        )
        outputs = tuple(
            OutputFile.classify(node, item)
            for node, ui in self.ui.items()
            for item in ui.get("images") or ui.get("gifs") or ui.get("videos") or ()
            if isinstance(item, Mapping) and item.get("filename")
        )
        return RunResult(
            prompt_id=self.prompt_id,
            backend=self.backend,
            status=status,
            outputs=outputs,
            ui=self.ui,
            error=self.error,
            interruption=self.interruption,
            timings=Timings(
                execution_start_ms=self.start_ms,
                execution_end_ms=self.end_ms,
                node_ms=dict(self.node_ms),
                cached_nodes=self.cached,
                progress=tuple(self.progress),
            ),
        )


def _result_from_history(
    prompt_id: str, backend: str, entry: Mapping[str, Any]
) -> RunResult | None:
    """A RunResult from a finished history entry; None while it is not finished."""
    status = entry.get("status") or {}
    messages = status.get("messages") or []
    tracker = _Tracker(prompt_id, backend)
    finished = bool(status.get("completed"))
    for message in messages:
        if isinstance(message, list | tuple) and len(message) == 2:
            event = events.parse_message({"type": message[0], "data": message[1]})
            tracker.feed(event)
            if isinstance(
                event,
                events.ExecutionSuccess | events.ExecutionError | events.ExecutionInterrupted,
            ):
                finished = True
    if not finished and status.get("status_str") not in ("success", "error"):
        return None
    for node, output in (entry.get("outputs") or {}).items():
        if isinstance(output, Mapping):
            tracker.ui[str(node)] = dict(output)
    if status.get("status_str") == "error" and not (tracker.error or tracker.interruption):
        tracker.error = events.ExecutionError(
            prompt_id, None, None, "the backend reported an error", None
        )
    return tracker.result()


# --- the socket -----------------------------------------------------------------------


_LOST = object()  # queued to listeners when the socket dies


class _Socket:
    """One WebSocket with its own client_id, fanning events out to listeners."""

    def __init__(self, client_id: str, conn: ClientConnection, backend: str) -> None:
        self.client_id = client_id
        self.conn = conn
        self.backend = backend
        self.listeners: dict[str, asyncio.Queue[Any]] = {}
        self.current_prompt: str | None = None
        self.alive = True
        self.reader = asyncio.create_task(self._read(), name=f"comfy-ws-{backend}")

    def listen(self, prompt_id: str) -> asyncio.Queue[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.listeners[prompt_id] = queue
        if not self.alive:
            queue.put_nowait(_LOST)
        return queue

    def unlisten(self, prompt_id: str) -> None:
        self.listeners.pop(prompt_id, None)

    async def _read(self) -> None:
        try:
            async for frame in self.conn:
                try:
                    event = (
                        events.parse_binary(frame)
                        if isinstance(frame, bytes)
                        else events.parse_text(frame)
                    )
                except errors.BackendProtocolError:
                    log.warning("backend %s sent an unreadable message", self.backend)
                    continue
                self._route(event)
        except websockets.ConnectionClosed:
            pass
        except Exception:  # the reader must never die silently
            log.exception("WebSocket reader for backend %s failed", self.backend)
        finally:
            self.alive = False
            for queue in self.listeners.values():
                queue.put_nowait(_LOST)

    def _route(self, event: events.Event) -> None:
        arrived = time.monotonic()
        pid = event.prompt_id
        if isinstance(event, events.ExecutionStart):
            self.current_prompt = pid
        if pid is None:
            if isinstance(event, events.Status):
                for queue in self.listeners.values():
                    queue.put_nowait((arrived, event))
                return
            pid = self.current_prompt  # legacy previews and text carry no prompt id
        if isinstance(event, events.Executing) and event.node is None:
            self.current_prompt = None
        if pid is not None and pid in self.listeners:
            self.listeners[pid].put_nowait((arrived, event))

    async def close(self) -> None:
        self.alive = False
        with contextlib.suppress(Exception):
            await self.conn.close()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader


# --- the client -----------------------------------------------------------------------


def _socks_h(proxy: str | None) -> str | None:
    """Make the proxy resolve host names itself (no local DNS, .anon works)."""
    if proxy is None:
        return None
    if proxy.startswith("socks5://"):
        return "socks5h://" + proxy[len("socks5://") :]
    if proxy.startswith("socks4://"):
        return "socks4a://" + proxy[len("socks4://") :]
    return proxy


_LIMIT = re.compile(r"(\d+(?:\.\d+)?)")


class ComfyClient:
    """Talks to one ComfyUI backend.

    Args:
        base_url: e.g. ``http://127.0.0.1:8188`` or ``http://xyz.anon``.
        name: the backend's name, used in every error message.
        timeout: seconds for each HTTP request and for opening the WebSocket.
        proxy: a SOCKS URL (``socks5://user:pass@127.0.0.1:9050``) for HTTP and WebSocket.
        poll_interval: seconds between /queue + /history checks when following a job
            without events (re-attach, lost socket).
        check_interval: seconds of silence on the socket after which the client checks
            that the job still exists (a cleared job gets no event at all).
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "comfyui",
        timeout: float = 30.0,
        proxy: str | None = None,
        poll_interval: float = POLL_INTERVAL,
        check_interval: float = CHECK_INTERVAL,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.check_interval = check_interval
        self._proxy = _socks_h(proxy)
        self._http = transport.Http(backend=name, timeout=timeout, proxy=self._proxy)
        self._socket: _Socket | None = None
        self._socket_lock = asyncio.Lock()
        self._object_info: dict[str, Any] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<ComfyClient {self.name}>"

    async def __aenter__(self) -> ComfyClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        if self._socket is not None:
            await self._socket.close()
            self._socket = None
        await self._http.aclose()

    @property
    def client_id(self) -> str | None:
        """The client_id of the live WebSocket, if one is open."""
        return self._socket.client_id if self._socket and self._socket.alive else None

    # --- HTTP plumbing ----------------------------------------------------------------

    def _url(self, path: str) -> str:
        return self.base_url + path

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ComfyError(f"the client for backend {self.name} is closed",
                                    backend=self.name)

    async def _send(self, method: str, path: str, **kwargs: Any) -> transport.Reply:
        self._check_open()
        return await self._http.request(method, self._url(path), **kwargs)

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request; return the decoded JSON, or None for an empty 200."""
        response = await self._send(method, path, **kwargs)
        if response.status != 200:
            raise self._status_error(method, path, response)
        return self._json(method, path, response)

    def _json(self, method: str, path: str, response: transport.Reply) -> Any:
        if not response.body.strip():
            return None
        try:
            return json.loads(response.body)
        except ValueError as exc:
            raise errors.BackendProtocolError(
                f"backend {self.name} answered {method} {path} with something that is not JSON",
                backend=self.name,
            ) from exc

    def _status_error(
        self, method: str, path: str, response: transport.Reply
    ) -> errors.ComfyError:
        code = response.status
        if code == 403:
            return errors.BackendProtocolError(
                f"backend {self.name} refused {method} {path} (403 forbidden)",
                backend=self.name, transient=False,
            )
        if code in (502, 503, 504):
            return errors.BackendUnreachable(backend=self.name)
        return errors.BackendProtocolError(
            f"backend {self.name} answered {method} {path} with status {code}",
            backend=self.name,
        )

    # --- submitting and following jobs -----------------------------------------------

    async def submit(
        self,
        prompt: Mapping[str, Any],
        *,
        prompt_id: str | None = None,
        front: bool = False,
        extra_data: Mapping[str, Any] | None = None,
        client_id: str | None = None,
    ) -> Submitted:
        """POST /prompt. Raises WorkflowRejected if any output fails validation."""
        body: dict[str, Any] = {"prompt": prompt, "prompt_id": prompt_id or str(uuid.uuid4())}
        cid = client_id or self.client_id
        if cid is not None:
            body["client_id"] = cid
        if front:
            body["front"] = True
        if extra_data:
            body["extra_data"] = dict(extra_data)
        response = await self._send("POST", "/prompt", json=body)
        if response.status == 400:
            data = self._json("POST", "/prompt", response) or {}
            if not isinstance(data, Mapping):
                raise errors.BackendProtocolError(
                    f"backend {self.name} rejected the workflow without saying why",
                    backend=self.name,
                )
            raise errors.WorkflowRejected(
                data.get("error"), data.get("node_errors"), backend=self.name
            )
        if response.status == 413:
            raise errors.UploadTooLarge(self._limit(response), backend=self.name)
        if response.status != 200:
            raise self._status_error("POST", "/prompt", response)
        data = self._json("POST", "/prompt", response)
        if not isinstance(data, Mapping) or "prompt_id" not in data:
            raise errors.BackendProtocolError(
                f"backend {self.name} accepted the workflow with an unreadable answer",
                backend=self.name,
            )
        node_errors = data.get("node_errors") or {}
        if node_errors:
            # Some outputs would not run; we want all of them, so take it back out.
            # An idle server has already started it: deleting from the queue would
            # not stop it, so interrupt it if it runs, drop it if it waits.
            with contextlib.suppress(errors.ComfyError):
                await self.cancel(str(data["prompt_id"]))
            raise errors.WorkflowRejected(
                {"type": "prompt_outputs_failed_validation",
                 "message": "Prompt outputs failed validation"},
                node_errors,
                backend=self.name,
            )
        return Submitted(str(data["prompt_id"]), float(data.get("number", 0)), node_errors)

    async def _open_socket(self) -> _Socket:
        async with self._socket_lock:
            if self._socket is not None and self._socket.alive:
                return self._socket
            if self._socket is not None:
                # Let the old socket close fully before a new one: see the
                # duplicate-clientId bug (notes §8). The new one has a fresh id anyway.
                await self._socket.close()
                self._socket = None
            client_id = uuid.uuid4().hex
            url = re.sub(r"^http", "ws", self.base_url) + f"/ws?clientId={client_id}"
            try:
                conn = await ws_connect(
                    url,
                    origin=None,
                    proxy=self._proxy,  # None: never the environment's proxy
                    open_timeout=self.timeout,
                    close_timeout=min(self.timeout, 5.0),
                    max_size=None,
                    compression=None,
                    user_agent_header=None,
                )
            except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
                raise errors.BackendUnreachable(backend=self.name) from exc
            except Exception as exc:  # python-socks errors are not OSErrors
                if type(exc).__module__.startswith("python_socks"):
                    raise errors.BackendUnreachable(backend=self.name) from exc
                raise
            try:
                await conn.send('{"type":"feature_flags","data":'
                                '{"supports_preview_metadata":true}}')
            except websockets.ConnectionClosed as exc:
                raise errors.BackendUnreachable(backend=self.name) from exc
            self._socket = _Socket(client_id, conn, self.name)
            return self._socket

    async def run(
        self,
        prompt: Mapping[str, Any],
        *,
        prompt_id: str | None = None,
        on_event: EventCallback | None = None,
        front: bool = False,
        extra_data: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Submit a prompt and follow it to the end. Check `result.raise_for_status()`."""
        pid = prompt_id or str(uuid.uuid4())
        socket = await self._open_socket()  # before posting, so no event is missed
        queue = socket.listen(pid)
        try:
            await self.submit(
                prompt, prompt_id=pid, front=front, extra_data=extra_data,
                client_id=socket.client_id,
            )
            return await self._follow_socket(pid, queue, on_event, time.monotonic())
        finally:
            socket.unlisten(pid)

    async def follow(self, prompt_id: str, *, on_event: EventCallback | None = None) -> RunResult:
        """Re-attach to a prompt submitted earlier (maybe by another process).

        Its events go to the socket that submitted it, so this polls /queue and
        /history. Raises JobLost if the backend knows nothing of it.
        """
        done = await self._reconcile(prompt_id)
        if done is not None:
            return done
        return await self._poll(prompt_id, on_event)

    async def _reconcile(self, prompt_id: str) -> RunResult | None:
        """History first, then the queue; raises JobLost when neither knows it."""
        result = await self._finished(prompt_id)
        if result is not None:
            return result
        state = await self.queue()
        if state.position(prompt_id) is not None:
            return None
        # It may have finished between the two calls: history is written together
        # with the removal from the queue, so a second look settles it.
        result = await self._finished(prompt_id)
        if result is not None:
            return result
        raise errors.JobLost(prompt_id, backend=self.name)

    async def _finished(self, prompt_id: str) -> RunResult | None:
        entry = await self.history(prompt_id)
        return None if entry is None else _result_from_history(prompt_id, self.name, entry)

    async def _poll(self, prompt_id: str, on_event: EventCallback | None) -> RunResult:
        last: int | None = None
        while True:
            state = await self.queue()
            position = state.position(prompt_id)
            if position is None:
                # out of the queue: history was written in the same step, or it is lost
                entry = await self.history(prompt_id)
                if entry is None:
                    raise errors.JobLost(prompt_id, backend=self.name)
                result = _result_from_history(prompt_id, self.name, entry)
                if result is not None:
                    return result
            elif position != last:
                last = position
                await _call_back(on_event, events.QueuePosition(prompt_id, position))
            await asyncio.sleep(self.poll_interval)

    async def _emit_position(
        self, prompt_id: str, on_event: EventCallback | None, queue_remaining: int | None = None
    ) -> None:
        """Tell the caller where the prompt waits (when it has not started soon after
        submitting, and on each `status` the server broadcasts when its queue changes,
        until it starts). GET /queue carries every queued
        prompt in full, so it is asked only when the small count says others wait too."""
        if on_event is None:
            return
        if queue_remaining is None:
            queue_remaining = await self.queue_remaining()
        if queue_remaining <= 1:  # ours is the only prompt there: running, or next
            await _call_back(on_event, events.QueuePosition(prompt_id, 0))
            return
        position = (await self.queue()).position(prompt_id)
        if position is not None:
            await _call_back(on_event, events.QueuePosition(prompt_id, position))

    async def _follow_socket(
        self, prompt_id: str, queue: asyncio.Queue[Any], on_event: EventCallback | None,
        submitted_at: float = 0.0,
    ) -> RunResult:
        tracker = _Tracker(prompt_id, self.name)
        # Where the prompt waits is asked only if it has not started within a moment: on an
        # idle backend (the usual case) it starts at once and the question costs a request.
        position_due = submitted_at + POSITION_GRACE if on_event is not None else None
        while not tracker.done:
            timeout = self.check_interval
            if position_due is not None:
                timeout = max(0.0, min(timeout, position_due - time.monotonic()))
            try:
                # Events come in bursts: take a waiting one without arming a timer.
                if queue.empty():
                    async with asyncio.timeout(timeout):
                        item = await queue.get()
                else:
                    item = queue.get_nowait()
            except TimeoutError:
                if position_due is not None:
                    position_due = None
                    await self._emit_position(prompt_id, on_event)
                    continue
                result = await self._reconcile(prompt_id)  # JobLost if it was cleared
                if result is not None:
                    return result
                continue
            if item is _LOST:
                log.info("lost the event stream of backend %s; polling instead", self.name)
                result = await self._reconcile(prompt_id)
                return result if result is not None else await self._poll(prompt_id, on_event)
            arrived, event = item
            tracker.feed(event, arrived)
            if tracker.started:
                position_due = None
            if isinstance(event, events.Status) and not tracker.started and on_event is not None:
                # A status that arrived before our prompt was accepted may not count it; the
                # position asked for after the grace covers that case.
                if arrived >= submitted_at:
                    position_due = None
                    await self._emit_position(prompt_id, on_event, event.queue_remaining)
                continue
            if not isinstance(event, events.Status):
                await _call_back(on_event, event)
        return tracker.result()

    # --- control ----------------------------------------------------------------------

    async def interrupt(self, prompt_id: str | None = None) -> bool:
        """Interrupt a running prompt; with an id, only if it is the one running.

        Older servers ignore the id and stop whatever runs, so the queue is checked
        first. Returns whether an interrupt was sent.
        """
        if prompt_id is None:
            await self._call("POST", "/interrupt", json={})
            return True
        state = await self.queue()
        if not any(item.prompt_id == prompt_id for item in state.running):
            return False
        await self._call("POST", "/interrupt", json={"prompt_id": prompt_id})
        return True

    async def cancel(self, prompt_id: str) -> Literal["interrupted", "removed", "unknown"]:
        """Stop a prompt wherever it is: interrupt it if running, drop it if waiting."""
        state = await self.queue()
        position = state.position(prompt_id)
        if position == 0:
            await self._call("POST", "/interrupt", json={"prompt_id": prompt_id})
            return "interrupted"
        if position is not None:
            await self.delete_queued([prompt_id])
            # It may have started between the look and the delete (which only
            # touches waiting prompts): then interrupt it instead.
            state = await self.queue()
            if any(item.prompt_id == prompt_id for item in state.running):
                await self._call("POST", "/interrupt", json={"prompt_id": prompt_id})
                return "interrupted"
            return "removed"
        return "unknown"

    async def queue(self) -> QueueState:
        data = await self._call("GET", "/queue")
        if not isinstance(data, Mapping):
            raise errors.BackendProtocolError(
                f"backend {self.name} sent an unreadable queue", backend=self.name
            )
        try:
            running = tuple(_queue_item(i) for i in data.get("queue_running") or ())
            pending = sorted(
                (_queue_item(i) for i in data.get("queue_pending") or ()),
                key=lambda item: (item.number, item.prompt_id),
            )
        except (TypeError, ValueError, IndexError) as exc:
            raise errors.BackendProtocolError(
                f"backend {self.name} sent an unreadable queue", backend=self.name
            ) from exc
        return QueueState(running, tuple(pending))

    async def queue_remaining(self) -> int:
        """Prompts running plus pending (GET /prompt: a small answer, unlike /queue)."""
        data = await self._call("GET", "/prompt")
        try:
            return int(data["exec_info"]["queue_remaining"])
        except (TypeError, KeyError, ValueError) as exc:
            raise errors.BackendProtocolError(
                f"backend {self.name} answered GET /prompt with an unexpected shape",
                backend=self.name,
            ) from exc

    async def queue_position(self, prompt_id: str) -> int | None:
        return (await self.queue()).position(prompt_id)

    async def delete_queued(self, prompt_ids: Sequence[str]) -> None:
        await self._call("POST", "/queue", json={"delete": list(prompt_ids)})

    async def clear_queue(self) -> None:
        await self._call("POST", "/queue", json={"clear": True})

    async def history(self, prompt_id: str) -> dict[str, Any] | None:
        """The history entry of a prompt, or None (unknown or not finished yet)."""
        data = await self._call("GET", f"/history/{prompt_id}")
        if not data:
            return None
        if not isinstance(data, Mapping) or not isinstance(data.get(prompt_id), Mapping):
            raise errors.BackendProtocolError(
                f"backend {self.name} sent an unreadable history entry", backend=self.name
            )
        return dict(data[prompt_id])

    async def object_info(self, *, refresh: bool = False) -> dict[str, Any]:
        """Every node definition (about 500 KB); cached until refresh=True."""
        if self._object_info is None or refresh:
            data = await self._call("GET", "/object_info")
            if not isinstance(data, Mapping):
                raise errors.BackendProtocolError(
                    f"backend {self.name} sent unreadable node definitions", backend=self.name
                )
            self._object_info = dict(data)
        return self._object_info

    async def system_stats(self) -> dict[str, Any]:
        data = await self._call("GET", "/system_stats")
        if not isinstance(data, Mapping):
            raise errors.BackendProtocolError(
                f"backend {self.name} sent unreadable system stats", backend=self.name
            )
        return dict(data)

    async def models(self, folder: str) -> list[str]:
        """File names in one model folder (checkpoints, loras, vae, ...); [] if none."""
        response = await self._send("GET", f"/models/{folder}")
        if response.status == 404:
            return []
        if response.status != 200:
            raise self._status_error("GET", f"/models/{folder}", response)
        data = self._json("GET", f"/models/{folder}", response)
        if not isinstance(data, list):
            raise errors.BackendProtocolError(
                f"backend {self.name} sent an unreadable model list", backend=self.name
            )
        return [str(name) for name in data]

    async def features(self) -> dict[str, Any]:
        """Server features; {} on servers too old to have the route."""
        response = await self._send("GET", "/features")
        if response.status == 404:
            return {}
        if response.status != 200:
            raise self._status_error("GET", "/features", response)
        data = self._json("GET", "/features", response)
        return dict(data) if isinstance(data, Mapping) else {}

    # --- files -------------------------------------------------------------------------

    async def upload_image(
        self,
        data: bytes,
        filename: str,
        *,
        subfolder: str = "",
        type: str = "input",
        overwrite: bool = False,
    ) -> UploadedFile:
        form = {"overwrite": "true" if overwrite else "false", "type": type}
        if subfolder:
            form["subfolder"] = subfolder
        response = await self._send(
            "POST", "/upload/image",
            data=_upload_form(form, data, filename),
        )
        if response.status == 413:
            raise errors.UploadTooLarge(self._limit(response), backend=self.name)
        if response.status == 400:
            raise errors.UploadRejected(
                f"backend {self.name} refused the file name or folder of the upload",
                backend=self.name,
            )
        if response.status != 200:
            raise self._status_error("POST", "/upload/image", response)
        answer = self._json("POST", "/upload/image", response)
        if not isinstance(answer, Mapping) or "name" not in answer:
            raise errors.BackendProtocolError(
                f"backend {self.name} sent an unreadable upload answer", backend=self.name
            )
        return UploadedFile(
            str(answer["name"]), str(answer.get("subfolder") or ""),
            str(answer.get("type") or type),
        )

    @staticmethod
    def _limit(response: transport.Reply) -> int | None:
        found = _LIMIT.search(response.text or "")
        return int(float(found[1])) if found else None

    def _view_params(self, file: OutputFile | UploadedFile) -> dict[str, str]:
        name = file.filename if isinstance(file, OutputFile) else file.name
        return {"filename": name, "subfolder": file.subfolder, "type": file.type}

    async def download(self, file: OutputFile | UploadedFile) -> bytes:
        """GET /view: the whole file."""
        chunks = [chunk async for chunk in self.stream(file)]
        return b"".join(chunks)

    async def stream(self, file: OutputFile | UploadedFile) -> AsyncIterator[bytes]:
        """GET /view: the file in chunks, for big videos."""
        self._check_open()
        url, params = self._url("/view"), self._view_params(file)
        async with self._http.open("GET", url, params=params) as response:
            if response.status == 404:
                name = PurePosixPath(params["filename"]).name
                raise errors.FileNotFound(
                    f"backend {self.name} has no file {name}", backend=self.name
                )
            if response.status != 200:
                body = transport.Reply(response.status, await response.read())
                raise self._status_error("GET", "/view", body)
            async for chunk in response.content.iter_chunked(STREAM_CHUNK):
                yield chunk


def _upload_form(fields: Mapping[str, str], data: bytes, filename: str) -> aiohttp.FormData:
    form = aiohttp.FormData(fields)
    form.add_field("image", data, filename=filename, content_type="application/octet-stream")
    return form


def _queue_item(raw: Any) -> QueueItem:
    number, prompt_id, prompt, extra, outputs = raw[:5]
    return QueueItem(
        number=float(number),
        prompt_id=str(prompt_id),
        prompt=prompt if isinstance(prompt, Mapping) else {},
        extra_data=extra if isinstance(extra, Mapping) else {},
        outputs_to_execute=tuple(str(o) for o in outputs or ()),
    )


async def _call_back(on_event: EventCallback | None, event: events.Event) -> None:
    if on_event is None:
        return
    result = on_event(event)
    if inspect.isawaitable(result):
        await result
