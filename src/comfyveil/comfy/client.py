"""An asyncio client for one ComfyUI backend: HTTP (`comfy.transport`), events over WebSocket.

One `ComfyClient` talks to one backend. It keeps one WebSocket (one client_id, `comfy.ws`) and
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
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import PurePosixPath
from types import TracebackType
from typing import Any, Literal

import aiohttp

from comfyveil.comfy import errors, limits, transport, ws
from comfyveil.comfy.follow import EventCallback, Following
from comfyveil.comfy.results import (
    OutputFile,
    QueueState,
    RunResult,
    Submitted,
    UploadedFile,
    queue_item,
)

__all__ = ["ComfyClient"]

POLL_INTERVAL = 1.0  # seconds between /queue + /history checks when no events can come
CHECK_INTERVAL = 15.0  # seconds of socket silence before checking the job still exists
STREAM_CHUNK = limits.STREAM_CHUNK  # bytes handed on at a time from a downloading output


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
_DEFAULT_LIMITS = limits.Limits()


class ComfyClient(Following):
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
        limits: how much one job may bring back (`[limits] max_output_bytes` and
            `max_outputs`); every other answer has a fixed cap (`comfy.limits`).
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
        limits: limits.Limits | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.check_interval = check_interval
        self.limits = limits or _DEFAULT_LIMITS
        self._proxy = _socks_h(proxy)
        self._http = transport.Http(backend=name, timeout=timeout, proxy=self._proxy)
        self._socket: ws.Socket | None = None
        self._socket_lock = asyncio.Lock()
        self._object_info: dict[str, Any] | None = None
        self._node_known: dict[str, bool] = {}
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

    async def drop_socket(self) -> None:
        """Close the WebSocket; the next job opens a fresh one with a new client_id.

        For a socket that went deaf: ComfyUI sends a client_id's events to the socket
        that connected with it last, and stops sending any once that one closes, while
        the first stays open (notes §8), so a socket can stay open and hear nothing."""
        async with self._socket_lock:
            if self._socket is not None:
                await self._socket.close()
                self._socket = None

    @property
    def client_id(self) -> str | None:
        """The client_id of the live WebSocket, if one is open."""
        return self._socket.client_id if self._socket and self._socket.alive else None

    # --- HTTP plumbing ----------------------------------------------------------------

    def _url(self, path: str) -> str:
        return self.base_url + path

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ComfyError(
                f"the client for backend {self.name} is closed", backend=self.name
            )

    async def _send(self, method: str, path: str, **kwargs: Any) -> transport.Reply:
        self._check_open()
        what = f"{method} /{path.split('/')[1]}"  # no prompt ids or file names in messages
        kwargs.setdefault("during", f"during {what}")
        return await self._http.request(method, self._url(path), what=what, **kwargs)

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

    def _status_error(self, method: str, path: str, response: transport.Reply) -> errors.ComfyError:
        code = response.status
        if code == 403:
            return errors.BackendProtocolError(
                f"backend {self.name} refused {method} {path} (403 forbidden)",
                backend=self.name,
                transient=False,
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
                {
                    "type": "prompt_outputs_failed_validation",
                    "message": "Prompt outputs failed validation",
                },
                node_errors,
                backend=self.name,
            )
        return Submitted(str(data["prompt_id"]), float(data.get("number", 0)), node_errors)

    async def _open_socket(self) -> ws.Socket:
        async with self._socket_lock:
            if self._socket is not None and self._socket.alive:
                return self._socket
            if self._socket is not None:
                # Let the old socket close fully before a new one: see the
                # duplicate-clientId bug (notes §8). The new one has a fresh id anyway.
                await self._socket.close()
                self._socket = None
            self._socket = await ws.connect(
                self.base_url,
                proxy=self._proxy,
                timeout=self.timeout,
                backend=self.name,
                limit=self.limits,
            )
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
                prompt,
                prompt_id=pid,
                front=front,
                extra_data=extra_data,
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

    async def follow_live(
        self, prompt_id: str, *, on_event: EventCallback | None = None
    ) -> RunResult:
        """Re-attach to a prompt and receive its own events, binary frames included.

        A prompt's events go to the socket whose id it was posted with. When the process
        that posted it is gone, so is that socket, and ComfyUI sends to whichever socket
        takes the id next: this one, opened with the id the queue shows for the prompt.
        (Were the old socket still open, the server would mute both when it closes; the
        silence then ends in the usual check of the queue and history.)
        """
        done = await self._reconcile(prompt_id)
        if done is not None:
            return done
        state = await self.queue()
        item = next(
            (i for i in (*state.running, *state.pending) if i.prompt_id == prompt_id), None
        )
        client_id = item.extra_data.get("client_id") if item is not None else None
        if not isinstance(client_id, str) or not client_id:
            return await self._poll(prompt_id, on_event)
        socket = await ws.connect(
            self.base_url,
            proxy=self._proxy,
            timeout=self.timeout,
            backend=self.name,
            limit=self.limits,
            client_id=client_id,
        )
        try:
            if state.running and state.running[0].prompt_id == prompt_id:
                socket.current_prompt = prompt_id
            queue = socket.listen(prompt_id)
            # It may have ended between the look at the queue and the new socket.
            done = await self._finished(prompt_id)
            if done is not None:
                return done
            return await self._follow_socket(prompt_id, queue, on_event, time.monotonic())
        finally:
            await socket.close()

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
            running = tuple(queue_item(i) for i in data.get("queue_running") or ())
            pending = sorted(
                (queue_item(i) for i in data.get("queue_pending") or ()),
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

    async def delete_history(self, prompt_ids: Sequence[str]) -> None:
        """POST /history {"delete": [...]}; unknown ids are ignored by the server."""
        await self._call("POST", "/history", json={"delete": list(prompt_ids)})

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
            data = await self._call("GET", "/object_info", limit=limits.OBJECT_INFO_BYTES)
            if not isinstance(data, Mapping):
                raise errors.BackendProtocolError(
                    f"backend {self.name} sent unreadable node definitions", backend=self.name
                )
            self._object_info = dict(data)
        return self._object_info

    async def has_node(self, class_type: str) -> bool:
        """Whether the backend has a node type (GET /object_info/{class}: 200 {} if not)."""
        if self._object_info is not None:
            return class_type in self._object_info
        if class_type not in self._node_known:
            data = await self._call("GET", f"/object_info/{class_type}")
            self._node_known[class_type] = isinstance(data, Mapping) and class_type in data
        return self._node_known[class_type]

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
        on_sent: Callable[[int], None] | None = None,
    ) -> UploadedFile:
        """POST /upload/image. A backend that stops reading the file for `timeout`
        seconds fails it (BackendStopped); `on_sent` hears of each piece that left."""
        form = {"overwrite": "true" if overwrite else "false", "type": type}
        if subfolder:
            form["subfolder"] = subfolder
        payload = transport.PacedUpload(data, idle=self.timeout, on_sent=on_sent)
        response = await self._send(
            "POST",
            "/upload/image",
            data=_upload_form(form, payload, filename),
            upload=payload,
            during="during the upload",
            deadline=False,  # as long as it moves: the job's deadline bounds it
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
            str(answer["name"]),
            str(answer.get("subfolder") or ""),
            str(answer.get("type") or type),
        )

    @staticmethod
    def _limit(response: transport.Reply) -> int | None:
        found = _LIMIT.search(response.text or "")
        return int(float(found[1])) if found else None

    def _view_params(self, file: OutputFile | UploadedFile) -> dict[str, str]:
        name = file.filename if isinstance(file, OutputFile) else file.name
        return {"filename": name, "subfolder": file.subfolder, "type": file.type}

    async def download(self, file: OutputFile | UploadedFile, *, limit: int | None = None) -> bytes:
        """GET /view: the whole file, at most `limit` bytes (default max_output_bytes)."""
        chunks = [chunk async for chunk in self.stream(file, limit=limit)]
        return b"".join(chunks)

    async def stream(
        self, file: OutputFile | UploadedFile, *, limit: int | None = None
    ) -> AsyncIterator[bytes]:
        """GET /view: the file in chunks, for big videos.

        Raises OutputTooLarge as soon as it passes `limit` bytes (default: the client's
        max_output_bytes), before reading any of it when the server says its length.
        A read that waits `timeout` seconds fails (BackendStopped); the caller bounds the
        whole download (a backend may trickle a byte at a time).
        """
        self._check_open()
        limit = self.limits.max_output_bytes if limit is None else limit
        url, params = self._url("/view"), self._view_params(file)
        async with self._http.open(
            "GET", url, params=params, during="while sending a file"
        ) as response:
            if response.status == 404:
                name = PurePosixPath(params["filename"]).name
                raise errors.FileNotFound(
                    f"backend {self.name} has no file {name}", backend=self.name
                )
            if response.status != 200:
                body = await transport.read_capped(
                    response, limits.JSON_ANSWER_BYTES, what="GET /view", backend=self.name
                )
                raise self._status_error("GET", "/view", transport.Reply(response.status, body))
            if response.content_length is not None and response.content_length > limit:
                raise errors.OutputTooLarge(limit, backend=self.name)
            received = 0
            async for chunk in response.content.iter_chunked(STREAM_CHUNK):
                received += len(chunk)
                if received > limit:
                    raise errors.OutputTooLarge(limit, backend=self.name)
                yield chunk


def _upload_form(
    fields: Mapping[str, str], data: transport.PacedUpload, filename: str
) -> aiohttp.FormData:
    form = aiohttp.FormData(fields)
    form.add_field("image", data, filename=filename, content_type="application/octet-stream")
    return form
