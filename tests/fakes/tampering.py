"""A tampering ComfyUI: the faithful fake, plus misbehaviours a test switches on.

A compromised GPU host (or a proxy in front of a real ComfyUI) can answer anything. Each
switch reproduces one case from issue 11; everything not switched on behaves exactly
like `FakeComfyUI`.

- `endless_view`: GET /view of an existing file streams zeros forever (no length).
- `trickle_view`: GET /view sends its headers, then one byte every `trickle_interval` s.
- `huge_ws_text`: the job's socket gets one text frame of that many bytes (valid JSON,
  a status padded out) when the job starts. The payload is written piece by piece and
  never built whole, so the test process does not pay for it.
- `listed_outputs`: SaveImage reports its image that many times (in `executed` and in
  history), as a server listing 20 000 outputs would.
- `stall_upload`: POST /upload/image reads nothing and never answers.
- `output_names`: SaveImage reports these file names (or `(subfolder, name)` pairs)
  instead of its own, and GET /view serves the real image for any of them (a server
  steering where files land).
- `view_body`: GET /view of an existing file answers these bytes instead (a crafted
  file: a damaged container, metadata hidden where the stripper does not look).
- `endless_json`: these GET paths (e.g. "/queue") answer 200 with endless JSON.
- `trickle_json`: these GET paths answer one byte every `trickle_interval` s.

Every misbehaving handler ends when the server stops, so teardown never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from tests.fakes.comfyui import FakeComfyUI, _NodeContext

CHUNK = 1 << 20


class TamperingComfyUI(FakeComfyUI):
    """`FakeComfyUI` with opt-in misbehaviours (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        endless_view: bool = False,
        trickle_view: bool = False,
        trickle_interval: float = 10.0,
        huge_ws_text: int = 0,
        listed_outputs: int = 0,
        stall_upload: bool = False,
        output_names: Iterable[str | tuple[str, str]] = (),
        endless_json: Iterable[str] = (),
        trickle_json: Iterable[str] = (),
        view_body: bytes | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.endless_view = endless_view
        self.trickle_view = trickle_view
        self.trickle_interval = trickle_interval
        self.huge_ws_text = huge_ws_text
        self.listed_outputs = listed_outputs
        self.stall_upload = stall_upload
        self.output_names = [
            ("", item) if isinstance(item, str) else item for item in output_names
        ]
        self.endless_json = set(endless_json)
        self.trickle_json = set(trickle_json)
        self.view_body = view_body
        # What the tests look at.
        self.view_bytes_sent = 0  # bytes of misbehaving /view bodies that left
        self.huge_text_sent = 0  # bytes of the huge text frame that left
        self.misbehaving = asyncio.Event()  # set when the first misbehaviour starts
        self.uploads_stalled = 0
        self._released = asyncio.Event()

    async def start(self) -> str:
        self._released = asyncio.Event()
        return await super().start()

    async def _halt(self, *, abort: bool) -> None:
        self._released.set()  # every hanging handler returns
        await super()._halt(abort=abort)

    async def _hold(self, seconds: float | None = None) -> bool:
        """Wait `seconds` (None: until stopped); True when the server is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), seconds)
        return self._released.is_set()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path.removeprefix("/api")
        if request.method == "GET" and path in self.endless_json | self.trickle_json:
            await super()._middleware(request, _ok)  # recorded like any request
            return await self._bad_json(request, trickle=path in self.trickle_json)
        return await super()._middleware(request, handler)

    # --- /view -------------------------------------------------------------------------

    async def _view(self, request: web.Request) -> web.StreamResponse:
        name = request.query.get("filename", "")
        if any(name == listed for _, listed in self.output_names):
            real = sorted(self.dirs["output"].rglob("*.png"))
            if real:
                return web.Response(body=real[-1].read_bytes(), content_type="image/png")
        if not (self.endless_view or self.trickle_view):
            answer = await super()._view(request)
            if self.view_body is None or answer.status != 200:
                return answer
            self.misbehaving.set()
            return web.Response(body=self.view_body, content_type="image/png")
        answer = await super()._view(request)
        if answer.status != 200:
            return answer
        response = web.StreamResponse(headers={"Content-Type": "image/png"})
        await response.prepare(request)
        self.misbehaving.set()
        try:
            if self.endless_view:
                zeros = bytes(CHUNK)
                while not self._released.is_set():
                    await response.write(zeros)
                    self.view_bytes_sent += CHUNK
            else:
                while True:
                    await response.write(b"\x89")
                    self.view_bytes_sent += 1
                    if await self._hold(self.trickle_interval):
                        break
        except (ConnectionError, RuntimeError):
            pass  # the client hung up: what it should do
        return response

    # --- uploads, JSON ------------------------------------------------------------------

    async def _upload(self, request: web.Request) -> web.Response:
        if not self.stall_upload:
            return await super()._upload(request)
        self.uploads_stalled += 1
        self.misbehaving.set()
        await self._hold()
        if request.transport is not None:
            # Reading is paused (the body was never read), so a graceful end would
            # wait for aiohttp's lingering read: cut the connection instead.
            request.transport.abort()
        return web.Response(status=503)

    async def _bad_json(self, request: web.Request, *, trickle: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        self.misbehaving.set()
        try:
            await response.write(b'{"queue_running": [], "queue_pending": [')
            piece = b"[0, \"x\", {}, {}, []], " * (CHUNK // 24)
            while not self._released.is_set():
                if trickle:
                    await response.write(b" ")
                    if await self._hold(self.trickle_interval):
                        break
                else:
                    await response.write(piece)
        except (ConnectionError, RuntimeError):
            pass
        return response

    # --- the WebSocket and outputs ------------------------------------------------------

    async def _send(self, event: str, data: dict[str, Any], sid: str | None) -> None:
        if event == "execution_start" and self.huge_ws_text and sid in self.sockets:
            await self._send_huge_text(self.sockets[sid])
        await super()._send(event, data, sid)

    async def _send_huge_text(self, ws: web.WebSocketResponse) -> None:
        """One unfragmented text frame of `huge_ws_text` bytes, written as it goes."""
        transport = ws._req.transport if ws._req is not None else None  # type: ignore[attr-defined]
        if transport is None:
            return
        self.misbehaving.set()
        size = self.huge_ws_text
        head, tail = b'{"type": "status", "data": {"pad": "', b'"}}'
        transport.write(bytes([0x81, 127]) + struct.pack(">Q", size) + head)
        left = size - len(head) - len(tail)
        pad = b"a" * CHUNK
        while left > 0 and not transport.is_closing():
            piece = pad[: min(CHUNK, left)]
            transport.write(piece)
            left -= len(piece)
            self.huge_text_sent += len(piece)
            while transport.get_write_buffer_size() > 4 * CHUNK and not transport.is_closing():
                await asyncio.sleep(0.005)
        if not transport.is_closing():
            transport.write(tail)

    async def _node_SaveImage(self, i: dict[str, Any], ctx: _NodeContext) -> Any:
        outs, ui = await super()._node_SaveImage(i, ctx)
        if self.output_names or self.listed_outputs:
            self.misbehaving.set()
        if self.output_names:
            image = ui["images"][0]
            ui = {"images": [
                dict(image, subfolder=subfolder, filename=name)
                for subfolder, name in self.output_names
            ]}
        if self.listed_outputs:
            ui = {"images": ui["images"][:1] * self.listed_outputs}
        return outs, ui


async def _ok(_request: web.Request) -> web.Response:
    return web.Response(status=200)

