"""A protocol-faithful fake ComfyUI 0.3.64 server for tests and benchmarks.

It speaks the routes, answers and quirks recorded in shared/notes/comfyui-api.md:
the `/api` prefix, empty 200 bodies, `{}` for unknown ids, the 400 validation
shapes (checked against the real node definitions in tests/data), 500 text/plain for
malformed JSON, the Origin 403, an unsorted pending heap, one executor running the
queue in `number` order, the exact WebSocket event order, interrupts at node
boundaries and progress ticks, the duplicate-clientId bug, and binary previews.

Model-free nodes run for real with Pillow (EmptyImage, LoadImage, ImageInvert,
ImageScale, SaveImage, PreviewImage); model nodes are simulated by class so any
workflow built from the real node set runs: loaders are instant, samplers send
`steps` progress events, VAEDecode makes an image of the latent's size.

It is as strict as the real server wherever a client can notice; each part copies one
behaviour of ComfyUI 0.3.64 (file and function named where it lives):

- Execution cache (execution.py, PromptExecutor.execute_async with the default
  CacheType.CLASSIC and CacheKeySetInputSignature in comfy_execution/caching.py): a node
  whose class, IS_CHANGED and inputs (its ancestors' signatures included) equal those of
  the previous prompt is not run again. An identical prompt lists every node in
  `execution_cached`, sends no `executing` and no `progress`, replays output nodes'
  `executed` from the cache (same file names) and ends in milliseconds. Only the latest
  prompt's nodes stay cached (clean_unused). Hidden inputs (PROMPT, EXTRA_PNGINFO) are not
  part of a signature, so SaveImage is cached whenever its images and prefix are.
- Run time (what a GPU does, notes "Behaviour of a real sampler"): every sampler step
  costs `step_cost` seconds per megapixel of its latent, times the latent's frames and
  batch, plus `step_delay`; so a run grows with steps, pixels and frames by default, and a
  cache hit is visibly instant.
- The server's own queue (server.py post_prompt, main.py prompt_worker): a prompt posted
  while another runs waits in `queue_pending` (GET /queue) and gets its `execution_start`
  only when the single executor takes it, in `number` order.
- Model lists (folder_paths.get_filename_list, read again when a folder changes):
  /object_info, /models/<folder> and prompt validation see the files as they are now;
  `add_model` and `remove_model` change them, as copying a file into models/ does.
- Event order (execution.py execute, comfy_execution/progress.py WebUIProgressHandler,
  main.py hijack_progress): for each executed node `progress_state`, `executing`, per step
  `progress_state` + `progress` (+ preview), `executed` for output nodes, `progress_state`
  finished; then `execution_success`, a `status` and `executing` with node null.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import hashlib
import heapq
import io
import json
import mimetypes
import random
import re
import shutil
import socket
import string
import struct
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import av
from aiohttp import web
from PIL import Image, ImageOps, PngImagePlugin

OBJECT_INFO_FILE = Path(__file__).parent.parent / "data" / "comfyui-0.3.64-object_info.json"

# Model-list inputs and the folder their files live in.
MODEL_INPUTS = {
    "ckpt_name": "checkpoints",
    "unet_name": "diffusion_models",
    "clip_name": "text_encoders",
    "clip_name1": "text_encoders",
    "clip_name2": "text_encoders",
    "clip_name3": "text_encoders",
    "clip_name4": "text_encoders",
    "vae_name": "vae",
    "lora_name": "loras",
    "control_net_name": "controlnet",
    "style_model_name": "style_models",
    "gligen_name": "gligen",
    "hypernetwork_name": "hypernetworks",
    "photomaker_model_name": "photomaker",
}

MODEL_FOLDERS = [  # GET /models of 0.3.64, in its order
    "checkpoints", "configs", "loras", "vae", "text_encoders", "diffusion_models",
    "clip_vision", "style_models", "embeddings", "diffusers", "vae_approx", "controlnet",
    "gligen", "upscale_models", "custom_nodes", "hypernetworks", "photomaker", "classifiers",
    "model_patches", "audio_encoders",
]

# Classes whose IS_CHANGED returns the time: the real server never reuses their output.
NEVER_CACHED = frozenset({"SaveImageWebsocket"})

# ImageInvert as 0.3.64 computes it: x/255 in float32, 1 - x, 255 * x, truncated to uint8
# (one less than 255 - v for many v). Pure-Python float32 rounding via struct.
def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


_INVERT_LUT = [
    min(255, max(0, int(_f32(255.0 * _f32(1.0 - _f32(v / 255.0)))))) for v in range(256)
]

# What models=None "has": every file the shipped workflows name (notes §11).
DEFAULT_MODELS: dict[str, list[str]] = {
    "checkpoints": [
        "sd3.5_large_fp8_scaled.safetensors", "flux1-dev-fp8.safetensors",
        "flux1-schnell-fp8.safetensors",
    ],
    "diffusion_models": [
        "flux1-schnell.safetensors", "flux1-dev.safetensors",
        "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
        "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
        "qwen_image_edit_2509_fp8_e4m3fn.safetensors",
    ],
    "text_encoders": [
        "clip_l.safetensors", "t5xxl_fp16.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors",
        "qwen_2.5_vl_7b_fp8_scaled.safetensors",
    ],
    "vae": ["ae.safetensors", "wan_2.1_vae.safetensors", "qwen_image_vae.safetensors"],
    "loras": [
        "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors",
        "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors",
        "Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors",
    ],
}

SENSITIVE_EXTRA_DATA_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")
SAMPLERS = {"KSampler", "KSamplerAdvanced", "SamplerCustom", "SamplerCustomAdvanced"}
DEFAULT_MAX_UPLOAD = 100 * 1024 * 1024
# Seconds a sampler step costs per megapixel of latent (per frame, per batch item) unless a
# test says otherwise: small enough that the suite stays fast (Flux Dev's 20 steps at
# 1024x1024 take 0.04 s, Wan's 4 steps of 81 frames at 640x640 0.25 s), large enough that
# more steps or pixels take visibly longer and a cache hit stands out as instant.
DEFAULT_STEP_COST = 0.002


@functools.cache
def _load_object_info() -> dict[str, Any]:
    return json.loads(OBJECT_INFO_FILE.read_text())


@functools.cache
def _nodes_listing_files() -> tuple[str, ...]:
    """The nodes of the file whose inputs list model or input files: LoadImage and those
    with an input of MODEL_INPUTS."""
    return tuple(
        name
        for name, node in _load_object_info().items()
        if name == "LoadImage"
        or any(
            input_name in MODEL_INPUTS
            for category in ("required", "optional")
            for input_name in (node["input"].get(category) or {})
        )
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


_Validation = tuple[bool, dict[str, Any] | None, list[str], dict[str, Any]]


class _Interrupted(Exception):
    pass


class _NodeFailed(Exception):
    def __init__(self, message: str, exception_type: str = "Exception") -> None:
        super().__init__(message)
        self.exception_type = exception_type


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass(order=True)
class _Job:
    number: float
    prompt_id: str
    prompt: dict[str, Any] = field(compare=False)
    extra_data: dict[str, Any] = field(compare=False)
    outputs: list[str] = field(compare=False)

    def item(self) -> list[Any]:
        return [self.number, self.prompt_id, self.prompt, self.extra_data, self.outputs]


@dataclass
class _Latent:
    width: int
    height: int
    length: int = 1
    batch: int = 1


@dataclass
class _Video:
    frames: list[Image.Image]
    fps: float


@dataclass
class _Failure:
    node_type: str | None
    message: str
    exception_type: str


class FakeComfyUI:
    """A fake ComfyUI server on 127.0.0.1.

    Args:
        models: files per model folder; None = every file the shipped workflows need,
            and any file name is accepted.
        speed: multiplies every delay (0.6 = a faster GPU).
        node_delay: seconds each executed node takes.
        step_delay: seconds each sampler step takes, whatever its size.
        step_cost: seconds each sampler step takes per megapixel of its latent, times
            its frames and batch (added to step_delay); 0 makes a step's time flat.
        delays: extra seconds per node class (e.g. {"ImageBlur": 1.0}).
        max_upload_size: bytes; None = the default 100 MB (reported as an int).
        prompt_interrupt: whether /interrupt honours {"prompt_id"} (newer servers).
        previews: send a latent preview frame on each sampler step.
        cache: reuse outputs of unchanged nodes from the previous prompt, like ComfyUI.
    """

    def __init__(
        self,
        models: dict[str, list[str]] | None = None,
        speed: float = 1.0,
        node_delay: float = 0.0,
        step_delay: float = 0.0,
        *,
        step_cost: float = DEFAULT_STEP_COST,
        delays: dict[str, float] | None = None,
        max_upload_size: int | None = None,
        prompt_interrupt: bool = True,
        previews: bool = False,
        cache: bool = True,
        root: Path | None = None,
    ) -> None:
        self.accept_any_model = models is None
        self.models = copy.deepcopy(DEFAULT_MODELS if models is None else models)
        self.speed = speed
        self.node_delay = node_delay
        self.step_delay = step_delay
        self.step_cost = step_cost
        self.delays: dict[str, float] = dict(delays or {})
        self.max_upload_size = max_upload_size or DEFAULT_MAX_UPLOAD
        self._upload_size_given = max_upload_size is not None
        self.prompt_interrupt = prompt_interrupt
        self.previews = previews
        self.cache_enabled = cache
        # Seconds every GET /view waits before answering: a slow link back to the bot
        # (an onion circuit, a big video), set by tests that need one.
        self.view_delay = 0.0
        # When set, every GET /view also waits until the test opens this gate: a link held
        # slow for exactly as long as a test needs, instead of a guessed delay.
        self.view_gate: asyncio.Event | None = None
        self._tmp = None if root else tempfile.TemporaryDirectory(prefix="fake-comfyui-")
        self.root = Path(root or self._tmp.name)  # type: ignore[union-attr]
        self.dirs = {name: self.root / name for name in ("input", "output", "temp")}
        for path in self.dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        self._node_defs = self._build_object_info()
        self._defs_models = copy.deepcopy(self.models)  # what _node_defs lists
        # /object_info's last answer, and what it was made of (see _object_info_text)
        self._info_text: tuple[dict[str, Any], tuple[Any, ...], str] | None = None
        # What tests look at; kept across restart() (they record, they are not memory).
        self.prompts: list[dict[str, Any]] = []
        self.executions: Counter[str] = Counter()
        # prompt id -> the nodes its last run took from the cache (kept when a client
        # deletes the history entry, as the no-trace mode does)
        self.cached_nodes: dict[str, list[str]] = {}
        self.uploads: list[dict[str, Any]] = []
        self.requests: list[RecordedRequest] = []
        self.interrupts: list[dict[str, Any]] = []
        self._failures: list[_Failure] = []
        self._troubled: list[str] = []  # routes whose next request answers 500 (see fail_requests)
        self._holds: dict[str, asyncio.Event] = {}  # routes whose requests wait (see hold)
        self.held: Counter[str] = Counter()  # requests that waited at each held route
        self.port = 0
        self._runner: web.AppRunner | None = None
        # While partitioned or killed, the port stays bound (not listening: a client is
        # refused, as by a dead server) so that no other server a test starts takes it:
        # a client coming back to "gpu0" would find someone else there.
        self._reserved: socket.socket | None = None
        self._reset_memory()

    # --- life cycle -------------------------------------------------------------------

    def _reset_memory(self) -> None:
        self.number = 0
        self.pending: list[_Job] = []  # a heap, served unsorted like the real one
        self.running: _Job | None = None
        self.history_entries: dict[str, dict[str, Any]] = {}
        self.sockets: dict[str, web.WebSocketResponse] = {}
        self.socket_flags: dict[str, dict[str, Any]] = {}
        self._cache: dict[str, tuple[list[Any], dict[str, Any] | None]] = {}
        self._preview_suffixes: dict[str, str] = {}  # PreviewImage node id -> its prefix
        self._interrupt = False
        self._last_node: str | None = None
        self._client_id: str | None = None
        self._wakeup = asyncio.Event()
        self._gate = asyncio.Event()
        self._gate.set()
        self._transports: set[asyncio.BaseTransport] = set()
        self._partitioned = False
        self._executor: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> str:
        # Like the real server: aiohttp's client_max_size counts the bytes of every request
        # body as they are read (a chunked body has no Content-Length to trust) and answers
        # 413 "Maximum request body size N exceeded." past it.
        app = web.Application(middlewares=[self._middleware],
                              client_max_size=int(self.max_upload_size))
        for prefix in ("", "/api"):
            self._routes(app, prefix)
        # A ComfyUI that is stopped or dies does not finish the requests it was answering
        # (aiohttp's default waits up to 60 s for them): a download held up at a crash ends
        # with the crash, not a minute later.
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        self._partitioned = False
        await site.start()
        self._release_port()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._executor = asyncio.create_task(self._execute_loop(), name="fake-comfyui-executor")
        return self.url

    async def stop(self) -> None:
        """A clean shutdown."""
        await self._halt(abort=False)
        self._release_port()

    async def kill(self) -> None:
        """Die like a crashed process: connections reset, the port stops answering."""
        await self._halt(abort=True)
        self._reserve_port()

    async def restart(self) -> str:
        """Come back on the same port with nothing in memory; `input/` and `output/` keep
        their files, `temp/` is emptied (ComfyUI's main.py removes it at every start)."""
        if self._runner is not None:
            await self.kill()
        self._reset_memory()
        shutil.rmtree(self.dirs["temp"], ignore_errors=True)
        self.dirs["temp"].mkdir(parents=True, exist_ok=True)
        return await self.start()

    async def partition(self) -> None:
        """Become unreachable while the GPU keeps working (a network partition, a broken
        circuit): connections reset, the port refuses, the queue runs on. `heal` ends it."""
        assert self._runner is not None
        self._partitioned = True
        for site in list(self._runner.sites):
            await site.stop()
        self._reserve_port()
        for transport in list(self._transports):
            transport.abort()  # type: ignore[attr-defined]

    async def heal(self) -> None:
        """Answer again on the same port, with everything that ran meanwhile."""
        assert self._runner is not None
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        self._partitioned = False
        await site.start()
        self._release_port()

    def _reserve_port(self) -> None:
        # What a client sees is unchanged: connection refused, as at the port of a
        # ComfyUI that crashed or cannot be reached. Only other servers are kept off it.
        if self._reserved is not None or not self.port:
            return
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            held.bind(("127.0.0.1", self.port))
        except OSError:
            held.close()  # taken in the instant it was free: nothing to hold
            return
        self._reserved = held

    def _release_port(self) -> None:
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    async def _halt(self, *, abort: bool) -> None:
        if self._executor is not None:
            self._executor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._executor
            self._executor = None
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if abort:
            for site in list(runner.sites):
                await site.stop()
            for transport in list(self._transports):
                transport.abort()  # type: ignore[attr-defined]
        else:
            for ws in list(self.sockets.values()):
                with contextlib.suppress(Exception):
                    await ws.close()
        self.sockets.clear()
        await runner.cleanup()

    async def __aenter__(self) -> FakeComfyUI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def close_files(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    # --- switches for tests -----------------------------------------------------------

    def fail_next_execution(
        self,
        node_type: str | None = None,
        message: str = "Simulated failure",
        exception_type: str = "RuntimeError",
    ) -> None:
        """The next execution of `node_type` (any node if None) raises."""
        self._failures.append(_Failure(node_type, message, exception_type))

    def fail_requests(self, path: str, times: int = 1) -> None:
        """Answer the next `times` requests to `path` (and paths below it, with or without
        the /api prefix) the way the real server answers an exception in a handler: 500,
        text/plain, "Server got itself in trouble". The server itself keeps running."""
        self._troubled.extend([path.rstrip("/")] * times)

    def hold(self, path: str, method: str = "GET") -> None:
        """Keep every `method` request to `path` (with or without /api) waiting before the
        server reads it, until `release(path)`: a test stops a client at that moment. A
        request whose client is gone by then is dropped unread, as it never arrived."""
        self._holds[f"{method} {path}"] = asyncio.Event()

    def release(self, path: str, method: str = "GET") -> None:
        gate = self._holds.pop(f"{method} {path}", None)
        if gate is not None:
            gate.set()

    def add_model(self, folder: str, name: str) -> None:
        """Install a model file, as copying it into models/<folder> does: the next
        /object_info, /models/<folder> and prompt validation see it, no restart."""
        files = self.models.setdefault(folder, [])
        if name not in files:
            files.append(name)

    def remove_model(self, folder: str, name: str) -> None:
        """Delete a model file: later requests no longer list or accept it."""
        files = self.models.get(folder, [])
        if name in files:
            files.remove(name)

    def set_delay(self, class_type: str, seconds: float) -> None:
        self.delays[class_type] = seconds

    def pause(self) -> None:
        """Stop taking jobs from the queue (the running one finishes)."""
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()
        self._wakeup.set()

    async def drop_sockets(self) -> None:
        """Reset every WebSocket connection (the server keeps running)."""
        for ws in list(self.sockets.values()):
            transport = ws._req.transport if ws._req is not None else None  # type: ignore[attr-defined]
            if transport is not None:
                transport.abort()

    def put_input(self, name: str, data: bytes) -> None:
        path = self.dirs["input"] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    # --- HTTP plumbing ----------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.transport is not None:
            if self._partitioned:
                # A connection accepted before the partition whose request is read after
                # it (a busy loop widens that instant): a partition leaves no way through.
                request.transport.abort()
                return web.Response(status=503)  # written to nobody
            self._transports.add(request.transport)
        self.requests.append(
            RecordedRequest(request.method, request.path, dict(request.query),
                            dict(request.headers))
        )
        if request.method == "OPTIONS":
            return web.Response(status=200)
        if _origin_mismatch(request):
            return web.Response(status=403)
        route = request.path.removeprefix("/api")
        for index, troubled in enumerate(self._troubled):
            if route == troubled or route.startswith(troubled + "/"):
                del self._troubled[index]
                return _server_error()
        gate = self._holds.get(f"{request.method} {route}")
        if gate is not None:
            self.held[f"{request.method} {route}"] += 1
            await gate.wait()
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=400)  # its client is gone: never handled
        return await handler(request)

    def _routes(self, app: web.Application, p: str) -> None:
        r = app.router
        r.add_get(p + "/ws", self._ws)
        r.add_get(p + "/prompt", self._get_prompt)
        r.add_post(p + "/prompt", self._post_prompt)
        r.add_get(p + "/queue", self._get_queue)
        r.add_post(p + "/queue", self._post_queue)
        r.add_get(p + "/history", self._get_history)
        r.add_get(p + "/history/{prompt_id}", self._get_history_item)
        r.add_post(p + "/history", self._post_history)
        r.add_post(p + "/interrupt", self._post_interrupt)
        r.add_post(p + "/free", self._empty_ok)
        r.add_get(p + "/object_info", self._get_object_info)
        r.add_get(p + "/object_info/{node_class}", self._get_object_info_class)
        r.add_get(p + "/system_stats", self._system_stats)
        r.add_get(p + "/features", self._features)
        r.add_get(p + "/embeddings", self._embeddings)
        r.add_get(p + "/models", self._model_folders)
        r.add_get(p + "/models/{folder}", self._models_folder)
        r.add_get(p + "/view", self._view)
        r.add_post(p + "/upload/image", self._upload)

    async def _empty_ok(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        return json.loads(raw)

    # --- WebSocket ---------------------------------------------------------------------

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sid = request.query.get("clientId") or uuid.uuid4().hex
        self.sockets[sid] = ws  # a second socket with this id replaces the first
        self.socket_flags.pop(sid, None)
        try:
            await ws.send_json(
                {"type": "status", "data": {"status": self._exec_info(), "sid": sid}}
            )
            if self._client_id == sid and self._last_node is not None:
                await ws.send_json({"type": "executing", "data": {"node": self._last_node}})
            first = True
            async for msg in ws:
                if msg.type != web.WSMsgType.TEXT or not first:
                    continue
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue  # the real server logs a warning and keeps going
                first = False
                if isinstance(data, dict) and data.get("type") == "feature_flags":
                    flags = dict(data.get("data") or {})
                    self.socket_flags[sid] = flags
                    await ws.send_json({"type": "feature_flags", "data": self._feature_data()})
        finally:
            self.sockets.pop(sid, None)  # the real server's bug: pops a replacement too
        return ws

    async def _send(self, event: str, data: dict[str, Any], sid: str | None) -> None:
        message = json.dumps({"type": event, "data": data})
        targets = list(self.sockets.values()) if sid is None else (
            [self.sockets[sid]] if sid in self.sockets else []
        )
        for ws in targets:
            with contextlib.suppress(Exception):
                await ws.send_str(message)

    async def _send_bytes(self, frame: bytes, sid: str | None) -> None:
        targets = list(self.sockets.values()) if sid is None else (
            [self.sockets[sid]] if sid in self.sockets else []
        )
        for ws in targets:
            with contextlib.suppress(Exception):
                await ws.send_bytes(frame)

    def _exec_info(self) -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": len(self.pending) + (self.running is not None)}}

    async def _broadcast_status(self) -> None:
        await self._send("status", {"status": self._exec_info()}, None)

    # --- simple routes -----------------------------------------------------------------

    def _feature_data(self) -> dict[str, Any]:
        size: float | int = (
            float(self.max_upload_size) if self._upload_size_given else self.max_upload_size
        )
        return {"supports_preview_metadata": True, "max_upload_size": size}

    async def _features(self, _request: web.Request) -> web.Response:
        return _json(self._feature_data())

    async def _system_stats(self, _request: web.Request) -> web.Response:
        return _json({
            "system": {
                "os": "posix", "ram_total": 25276502016, "ram_free": 24193929216,
                "comfyui_version": "0.3.64", "required_frontend_version": "1.27.10",
                "installed_templates_version": "0.1.95", "required_templates_version": "0.1.95",
                "python_version": "3.11.7 (main) [GCC 12.2.0]", "pytorch_version": "2.13.0+cpu",
                "embedded_python": False,
                "argv": ["main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port)],
            },
            "devices": [{
                "name": "cpu", "type": "cpu", "index": None, "vram_total": 25276502016,
                "vram_free": 24193929216, "torch_vram_total": 25276502016,
                "torch_vram_free": 24193929216,
            }],
        })

    async def _embeddings(self, _request: web.Request) -> web.Response:
        return _json([])

    async def _model_folders(self, _request: web.Request) -> web.Response:
        return _json(MODEL_FOLDERS)

    async def _models_folder(self, request: web.Request) -> web.Response:
        folder = request.match_info["folder"]
        if folder not in MODEL_FOLDERS:
            return web.Response(status=404)  # empty body, no Content-Type, like the real one
        return _json(sorted(self.models.get(folder, [])))

    def _build_object_info(self) -> dict[str, Any]:
        # Only the nodes whose lists change are copied: the rest are shared with the
        # parsed file (never changed in place), since copying all of them took a tenth
        # of the suite's CPU.
        info = dict(_load_object_info())
        for name in _nodes_listing_files():
            node = info[name]
            changed = False
            inputs = copy.deepcopy(node["input"])
            for category in ("required", "optional"):
                for input_name, spec in (inputs.get(category) or {}).items():
                    folder = MODEL_INPUTS.get(input_name)
                    if folder is None or not isinstance(spec, list) or not spec:
                        continue
                    files = sorted(self.models.get(folder, []))
                    if isinstance(spec[0], list):
                        spec[0] = sorted(set(spec[0]) | set(files))
                        changed = True
                    elif spec[0] == "COMBO" and len(spec) > 1 and isinstance(spec[1], dict):
                        spec[1]["options"] = sorted(set(spec[1].get("options") or []) | set(files))
                        changed = True
            if name == "LoadImage":
                inputs["required"]["image"][0] = self._input_files()
                changed = True
            if changed:
                info[name] = {**node, "input": inputs}
        return info

    def _input_files(self) -> list[str]:
        """LoadImage's list: image files directly in input/ (no subfolders), sorted."""
        base = self.dirs["input"]
        return sorted(
            p.name for p in base.iterdir()
            if p.is_file() and (mimetypes.guess_type(p.name, strict=False)[0] or "")
            .startswith("image/")
        )

    def _refresh_load_image(self) -> None:
        self._node_defs["LoadImage"]["input"]["required"]["image"][0] = self._input_files()

    def _refresh_models(self) -> None:
        """Rebuild the model lists when the files changed (add_model, or a test assigning
        `models`): the real server lists a folder as it is on disk at each request."""
        if self.models != self._defs_models:
            self._node_defs = self._build_object_info()
            self._defs_models = copy.deepcopy(self.models)

    async def _get_object_info(self, _request: web.Request) -> web.Response:
        self._refresh_models()
        self._refresh_load_image()
        return web.Response(text=self._object_info_text(), content_type="application/json")

    def _object_info_text(self) -> str:
        """/object_info as JSON, encoded again only when what it lists changed: 390 KB took
        5 ms to encode, and a fake is asked for it several times. The real server builds
        it at each request from what is on disk; the bytes a client gets are the same, and
        a changed list (models, input files) changes them at once here too. The key holds the
        definitions themselves (so a replaced dict is never mistaken for the one encoded),
        their number (a test may delete a node) and LoadImage's files."""
        load_image = self._node_defs.get("LoadImage")
        files = load_image["input"]["required"]["image"][0] if load_image else None
        key = (len(self._node_defs), tuple(files or ()))
        cached = self._info_text
        if cached is None or cached[0] is not self._node_defs or cached[1] != key:
            cached = self._info_text = (self._node_defs, key, json.dumps(self._node_defs))
        return cached[2]

    async def _get_object_info_class(self, request: web.Request) -> web.Response:
        name = request.match_info["node_class"]
        self._refresh_models()
        if name not in self._node_defs:
            return _json({})
        if name == "LoadImage":
            self._refresh_load_image()
        return _json({name: self._node_defs[name]})

    # --- prompt and queue --------------------------------------------------------------

    async def _get_prompt(self, _request: web.Request) -> web.Response:
        return _json({"exec_info": self._exec_info()["exec_info"]})

    async def _post_prompt(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
        except ValueError:
            return _server_error()
        if isinstance(body, (list, str)):
            # the real server only tests `"prompt" in body`: a list or string lacks it
            if "prompt" in body:
                return _server_error()
            self.number += 1
            error = {"type": "no_prompt", "message": "No prompt provided",
                     "details": "No prompt provided", "extra_info": {}}
            return _json({"error": error, "node_errors": {}}, status=400)
        if not isinstance(body, dict):
            return _server_error()
        if "number" in body:
            number: float = float(body["number"])
        else:
            number = -self.number if body.get("front") else self.number
            self.number += 1
        if "prompt" not in body:
            error = {"type": "no_prompt", "message": "No prompt provided",
                     "details": "No prompt provided", "extra_info": {}}
            return _json({"error": error, "node_errors": {}}, status=400)
        prompt = body["prompt"]
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        targets = body.get("partial_execution_targets")
        if isinstance(prompt, (list, str)) and not prompt:
            prompt = {}  # iterates as empty: "no outputs", like the real one
        if not isinstance(prompt, dict):
            return _server_error()  # validate_prompt indexes it and raises: a 500
        ok, error, outputs, node_errors = self._validate(prompt, targets)
        extra = dict(body.get("extra_data") or {})
        if "client_id" in body:
            extra["client_id"] = body["client_id"]
        if not ok:
            return _json({"error": error, "node_errors": node_errors}, status=400)
        for key in SENSITIVE_EXTRA_DATA_KEYS:
            extra.pop(key, None)
        self.prompts.append({"prompt_id": prompt_id, "number": number, "prompt": prompt,
                             "extra_data": extra, "outputs": outputs})
        heapq.heappush(self.pending, _Job(number, prompt_id, prompt, extra, outputs))
        self._wakeup.set()
        await self._broadcast_status()
        return _json({"prompt_id": prompt_id, "number": number, "node_errors": node_errors})

    async def _get_queue(self, _request: web.Request) -> web.Response:
        return _json({
            "queue_running": [self.running.item()] if self.running else [],
            "queue_pending": [job.item() for job in self.pending],
        })

    async def _post_queue(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request) or {}
        except ValueError:
            return _server_error()
        if body.get("clear"):
            self.pending.clear()
        if "delete" in body:
            drop = set(body["delete"] or [])
            self.pending = [job for job in self.pending if job.prompt_id not in drop]
            heapq.heapify(self.pending)
        await self._broadcast_status()
        return web.Response(status=200)

    async def _get_history(self, request: web.Request) -> web.Response:
        try:
            max_items = int(request.query["max_items"]) if "max_items" in request.query else None
            offset = int(request.query.get("offset", -1))
        except ValueError:
            return _server_error()
        items = list(self.history_entries.items())
        if offset < 0 and max_items is not None:
            offset = max(0, len(items) - max_items)
        start = max(offset, 0)
        end = start + max_items if max_items is not None else None
        return _json(dict(items[start:end]))

    async def _get_history_item(self, request: web.Request) -> web.Response:
        pid = request.match_info["prompt_id"]
        entry = self.history_entries.get(pid)
        return _json({pid: entry} if entry is not None else {})

    async def _post_history(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request) or {}
        except ValueError:
            return _server_error()
        if body.get("clear"):
            self.history_entries.clear()
        for pid in body.get("delete") or ():
            self.history_entries.pop(pid, None)
        return web.Response(status=200)

    async def _post_interrupt(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request) or {}
        except ValueError:
            body = {}
        self.interrupts.append(dict(body) if isinstance(body, dict) else {})
        target = body.get("prompt_id") if isinstance(body, dict) else None
        running = self.running.prompt_id if self.running is not None else None
        if target is None or not self.prompt_interrupt or running == target:
            self._interrupt = True
        return web.Response(status=200)

    # --- files -------------------------------------------------------------------------

    async def _view(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        filename = q.get("filename")
        if not filename:
            return web.Response(status=404)
        kind = q.get("type", "output")
        annotated = re.fullmatch(r"(.*) \[(input|output|temp)\]", filename)
        if annotated:
            filename, kind = annotated[1], annotated[2]
        if filename.startswith("/") or ".." in filename:
            return web.Response(status=400)
        base = self.dirs.get(kind)
        if base is None:
            return web.Response(status=400)
        folder = (base / q.get("subfolder", "")).resolve()
        if not folder.is_relative_to(base.resolve()):
            return web.Response(status=403)
        path = folder / filename
        if not path.is_file():
            return web.Response(status=404)
        if self.view_delay:
            await asyncio.sleep(self.view_delay)
        if self.view_gate is not None:
            await self.view_gate.wait()
        data = path.read_bytes()
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if content_type in ("text/html", "text/javascript", "application/javascript", "text/css"):
            content_type = "application/octet-stream"
        preview, channel = q.get("preview"), q.get("channel")
        if preview or channel:
            data, content_type = await asyncio.to_thread(_recode, data, preview, channel)
        return web.Response(
            body=data, content_type=content_type,
            headers={"Content-Disposition": f'filename="{path.name}"'},
        )

    async def _upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        image = form.get("image")
        if not image:
            return web.Response(status=400)
        if not isinstance(image, web.FileField):
            return _server_error()  # a part without a file name: `image.file` raises
        kind = str(form.get("type") or "input")
        base = self.dirs.get(kind)
        if base is None:
            return _server_error()  # the real one hits an unbound variable
        subfolder = str(form.get("subfolder") or "")
        folder = (base / subfolder).resolve()
        if not folder.is_relative_to(base.resolve()):
            return web.Response(status=400)
        data = image.file.read()
        name = image.filename or ""
        if not name:
            return _server_error()
        if not (folder / name).resolve().is_relative_to(base.resolve()):
            return web.Response(status=400)
        overwrite = form.get("overwrite") in ("true", "1")  # exactly, no lowercasing
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / name).parent.is_dir():
            return _server_error()  # a folder in the name: the real one fails to open it
        suffix = Path(name).suffix  # the name may hold a folder: keep it, like splitext
        stem = name[: len(name) - len(suffix)]
        path, duplicate, i = folder / name, False, 1
        if not overwrite:
            while path.exists():
                if hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest():
                    duplicate = True
                    break
                name = f"{stem} ({i}){suffix}"
                path = folder / name
                i += 1
        if not duplicate:
            path.write_bytes(data)
        # Tests look at what was sent after the file itself is gone (overwritten).
        self.uploads.append({"name": name, "subfolder": subfolder, "type": kind,
                             "size": len(data), "duplicate": duplicate,
                             "overwrite": overwrite, "data": data})
        return _json({"name": name, "subfolder": subfolder, "type": kind})

    # --- validation (execution.validate_prompt of 0.3.64) -----------------------------

    def _validate(
        self, prompt: Any, targets: list[str] | None
    ) -> tuple[bool, dict[str, Any] | None, list[str], dict[str, Any]]:
        def invalid(kind: str, message: str, details: str) -> _Validation:
            return False, {"type": kind, "message": message, "details": details,
                           "extra_info": {}}, [], {}

        if not isinstance(prompt, dict):
            return invalid("invalid_prompt", "Cannot execute: the prompt is not an object.", "")
        self._refresh_models()
        outputs: list[str] = []
        for node_id, node in prompt.items():
            if not isinstance(node, dict) or "class_type" not in node:
                return invalid("invalid_prompt",
                               "Cannot execute because a node is missing the class_type property.",
                               f"Node ID '#{node_id}'")
            class_type = node["class_type"]
            if class_type not in self._node_defs:
                return invalid("invalid_prompt",
                               f"Cannot execute because node {class_type} does not exist.",
                               f"Node ID '#{node_id}'")
            if self._node_defs[class_type].get("output_node") and (
                targets is None or node_id in targets
            ):
                outputs.append(node_id)
        if not outputs:
            return invalid("prompt_no_outputs", "Prompt has no outputs", "")
        good: list[str] = []
        failed: list[tuple[str, list[dict[str, Any]]]] = []
        node_errors: dict[str, Any] = {}
        validated: dict[str, tuple[bool, list[dict[str, Any]]]] = {}
        for out in outputs:
            try:
                ok, reasons = self._validate_node(prompt, out, validated)
            except Exception as exc:
                ok = False
                reasons = [{"type": "exception_during_validation",
                            "message": "Exception when validating node", "details": str(exc),
                            "extra_info": {"exception_type": type(exc).__name__,
                                           "traceback": ["(fake traceback)\n"]}}]
                validated[out] = (False, reasons)
            if ok:
                good.append(out)
                continue
            failed.append((out, reasons))
            for node_id, (valid, node_reasons) in validated.items():
                if not valid and node_reasons:
                    entry = node_errors.setdefault(node_id, {
                        "errors": node_reasons, "dependent_outputs": [],
                        "class_type": prompt[node_id]["class_type"],
                    })
                    entry["dependent_outputs"].append(out)
        if not good:
            details = "\n".join(f"{e['message']}: {e['details']}" for _o, rs in failed for e in rs)
            error = {"type": "prompt_outputs_failed_validation",
                     "message": "Prompt outputs failed validation", "details": details,
                     "extra_info": {}}
            return False, error, [], node_errors
        return True, None, good, node_errors

    def _validate_node(
        self, prompt: dict[str, Any], node_id: str,
        validated: dict[str, tuple[bool, list[dict[str, Any]]]],
    ) -> tuple[bool, list[dict[str, Any]]]:
        if node_id in validated:
            return validated[node_id]
        node = prompt[node_id]
        definition = self._node_defs[node["class_type"]]
        inputs = node.get("inputs") or {}
        errors: list[dict[str, Any]] = []
        valid = True
        for name, spec, category in _input_specs(definition):
            if name not in inputs:
                if category == "required":
                    errors.append({"type": "required_input_missing",
                                   "message": "Required input is missing", "details": name,
                                   "extra_info": {"input_name": name}})
                    valid = False
                continue
            value = inputs[name]
            input_type = spec[0] if isinstance(spec, list) and spec else spec
            has_config = isinstance(spec, list) and len(spec) > 1 and isinstance(spec[1], dict)
            config = spec[1] if has_config else {}
            if isinstance(value, list):
                if len(value) != 2:
                    errors.append({"type": "bad_linked_input",
                                   "message": "Bad linked input, must be a length-2 list of "
                                   "[node_id, slot_index]",
                                   "details": name, "extra_info": {"input_name": name,
                                                                   "input_config": spec,
                                                                   "received_value": value}})
                    valid = False
                    continue
                source_id = str(value[0])
                source_class = prompt[source_id]["class_type"]  # KeyError like the real one
                returns = self._node_defs[source_class].get("output") or []
                received = returns[int(value[1])] if int(value[1]) < len(returns) else None
                if not _types_match(received, input_type):
                    wanted = _type_name(input_type)
                    details = f"{name}, received_type({received}) mismatch input_type({wanted})"
                    errors.append({"type": "return_type_mismatch",
                                   "message": "Return type mismatch between linked nodes",
                                   "details": details,
                                   "extra_info": {"input_name": name, "input_config": spec,
                                                  "received_type": received, "linked_node": value}})
                    valid = False
                    continue
                source_ok, _ = self._validate_node(prompt, source_id, validated)
                if not source_ok:
                    valid = False
                continue
            converted: dict[str, Any] = {}
            error = self._check_value(node["class_type"], name, value, input_type, config, spec,
                                      converted)
            if isinstance(node.get("inputs"), dict):
                node["inputs"].update(converted)
            if error is not None:
                errors.append(error)
                valid = False
        validated[node_id] = (valid, errors)
        return valid, errors

    def _check_value(
        self, class_type: str, name: str, value: Any, input_type: Any,
        config: dict[str, Any], spec: Any, converted: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        if converted is None:
            converted = {}
        base = {"input_name": name, "input_config": spec, "received_value": value}
        if class_type == "LoadImage" and name == "image":
            path = _annotated(self.dirs, str(value), "input")
            if path is None or not path.is_file():
                return {"type": "custom_validation_failed",
                        "message": "Custom validation failed for node",
                        "details": f"{name} - Invalid image file: {value}",
                        "extra_info": {"input_name": name}}
            return None
        converters = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": bool}
        if isinstance(input_type, str) and input_type in converters:
            try:
                value = converters[input_type](value)  # int(40.5) == 40, like the real one
                converted[name] = value  # the real one writes it back into the prompt
                base = {**base, "received_value": value}
            except (TypeError, ValueError, OverflowError) as exc:
                return {"type": "invalid_input_type",
                        "message": f"Failed to convert an input value to a {input_type} value",
                        "details": f"{name}, {value}, {exc}",
                        "extra_info": {**base, "exception_message": str(exc)}}
            if input_type in ("INT", "FLOAT"):
                if "min" in config and value < config["min"]:
                    return {"type": "value_smaller_than_min",
                            "message": f"Value {value} smaller than min of {config['min']}",
                            "details": name, "extra_info": base}
                if "max" in config and value > config["max"]:
                    return {"type": "value_bigger_than_max",
                            "message": f"Value {value} bigger than max of {config['max']}",
                            "details": name, "extra_info": base}
            return None
        options: list[Any] | None = None
        if isinstance(input_type, list):
            options = input_type
        elif input_type == "COMBO":
            options = list(config.get("options") or [])
        if options is None:
            return None
        if name in MODEL_INPUTS and self.accept_any_model:
            return None
        if value in options:
            return None
        if len(options) > 20:
            list_info, shown = f"(list of length {len(options)})", None
        else:
            list_info, shown = str(options), spec
        return {"type": "value_not_in_list", "message": "Value not in list",
                "details": f"{name}: '{value}' not in {list_info}",
                "extra_info": {"input_name": name, "input_config": shown, "received_value": value}}

    # --- execution ----------------------------------------------------------------------

    async def _execute_loop(self) -> None:
        while True:
            await self._gate.wait()
            if not self.pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            job = heapq.heappop(self.pending)
            self.running = job
            try:
                await self._run_job(job)
            finally:
                self.running = None
                self._client_id = None
                self._last_node = None

    async def _run_job(self, job: _Job) -> None:
        self._interrupt = False
        self.executions[job.prompt_id] += 1
        sid = job.extra_data.get("client_id")
        self._client_id = sid
        pid = job.prompt_id
        messages: list[list[Any]] = []

        async def send(event: str, data: dict[str, Any], record: bool = False) -> None:
            if record:
                messages.append([event, data])
            if sid is not None:
                await self._send(event, data, sid)

        await self._broadcast_status()  # the worker took it
        await send("execution_start", {"prompt_id": pid, "timestamp": _now_ms()}, True)
        order = _execution_order(job.prompt, job.outputs)
        memo: dict[str, str] = {}
        signatures = {n: self._signature(job.prompt, n, memo) for n in order}
        hits = {n for n in order if self.cache_enabled and signatures[n] in self._cache}
        cached = [n for n in job.prompt if n in hits]  # listed in the prompt's own order
        self.cached_nodes[pid] = list(cached)
        await send("execution_cached",
                   {"nodes": cached, "prompt_id": pid, "timestamp": _now_ms()}, True)
        values: dict[str, list[Any]] = {}
        ui_outputs: dict[str, Any] = {}
        progress: dict[str, dict[str, Any]] = {}
        executed: list[str] = []
        status = "success"

        def state(node_id: str, value: float, maximum: float, st: str) -> dict[str, Any]:
            return {"value": value, "max": maximum, "state": st, "node_id": node_id,
                    "prompt_id": pid, "display_node_id": node_id, "parent_node_id": None,
                    "real_node_id": node_id}

        async def send_progress_state() -> None:
            # sent to the job's socket, or to every socket when it has no client_id
            await self._send("progress_state", {"prompt_id": pid, "nodes": dict(progress)}, sid)

        current = ""
        try:
            for node_id in order:
                current = node_id
                node = job.prompt[node_id]
                class_type = node["class_type"]
                if node_id in hits:
                    outs, ui = self._cache[signatures[node_id]]
                    values[node_id] = outs  # not "executed": the real list leaves it out
                    if ui is not None:
                        ui_outputs[node_id] = ui
                        await send("executed", {"node": node_id, "display_node": node_id,
                                                "output": ui, "prompt_id": pid})
                        progress[node_id] = state(node_id, 1, 1, "finished")
                        await send_progress_state()
                    continue
                progress[node_id] = state(node_id, 0.0, 1.0, "running")
                await send_progress_state()
                self._last_node = node_id
                await send("executing", {"node": node_id, "display_node": node_id,
                                         "prompt_id": pid})
                if self._interrupt:
                    raise _Interrupted
                inputs = {k: (values[str(v[0])][int(v[1])] if _is_link(v) else v)
                          for k, v in (node.get("inputs") or {}).items()}
                ctx = _NodeContext(self, job, node_id, sid, progress, state)
                outs, ui = await self._execute_node(class_type, inputs, ctx)
                values[node_id] = outs
                executed.append(node_id)
                if self.cache_enabled:
                    self._cache[signatures[node_id]] = (outs, ui)
                if ui is not None:
                    ui_outputs[node_id] = ui
                    await send("executed", {"node": node_id, "display_node": node_id,
                                            "output": ui, "prompt_id": pid})
                # the bar ends full at its own max (2/2 after two ticks), 1/1 otherwise
                top = float(progress[node_id]["max"])
                progress[node_id] = state(node_id, top, top, "finished")
                await send_progress_state()
            await send("execution_success", {"prompt_id": pid, "timestamp": _now_ms()}, True)
        except _Interrupted:
            status = "error"
            node = job.prompt[current]
            data = {"prompt_id": pid, "node_id": current, "node_type": node["class_type"],
                    "executed": list(set(executed)), "timestamp": _now_ms()}
            messages.append(["execution_interrupted", data])
            # broadcast when the job has no client (the real server does the same)
            await self._send("execution_interrupted", data, sid)
            ui_outputs = {}
        except _NodeFailed as failure:
            status = "error"
            node = job.prompt[current]
            data = {"prompt_id": pid, "node_id": current, "node_type": node["class_type"],
                    "executed": list(set(executed)), "exception_message": str(failure),
                    "exception_type": failure.exception_type,
                    "traceback": ['  File "execution.py", line 496, in execute\n',
                                  f"    raise {failure.exception_type}(...)\n"],
                    "current_inputs": {k: [repr(v)[:200]] for k, v in
                                       (node.get("inputs") or {}).items()},
                    "current_outputs": list(executed), "timestamp": _now_ms()}
            await send("execution_error", data, True)
            ui_outputs = {}
        if self.cache_enabled:
            keep = set(signatures.values())
            self._cache = {k: v for k, v in self._cache.items() if k in keep}
        self.history_entries[pid] = {
            "prompt": job.item(),
            "outputs": ui_outputs,
            "status": {"status_str": status, "completed": status == "success",
                       "messages": messages},
            "meta": {n: {"node_id": n, "display_node": n, "parent_node": None, "real_node_id": n}
                     for n in ui_outputs},
        }
        while len(self.history_entries) > 10000:
            self.history_entries.pop(next(iter(self.history_entries)))
        self.running = None
        self._last_node = None
        await self._broadcast_status()
        await send("executing", {"node": None, "prompt_id": pid})

    def _signature(self, prompt: dict[str, Any], node_id: str, memo: dict[str, str]) -> str:
        if node_id in memo:
            return memo[node_id]
        node = prompt[node_id]
        parts: dict[str, Any] = {}
        for key, value in sorted((node.get("inputs") or {}).items()):
            if _is_link(value):
                parts[key] = ["link", self._signature(prompt, str(value[0]), memo), value[1]]
            else:
                parts[key] = value
        if node["class_type"] == "LoadImage":
            path = _annotated(self.dirs, str(parts.get("image")), "input")
            if path is not None and path.is_file():
                parts["__hash"] = hashlib.sha256(path.read_bytes()).hexdigest()
        if node["class_type"] in NEVER_CACHED:
            parts["__changed"] = uuid.uuid4().hex  # IS_CHANGED returns time.time()
        memo[node_id] = hashlib.sha256(
            json.dumps([node["class_type"], parts], sort_keys=True, default=str).encode()
        ).hexdigest()
        return memo[node_id]

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds * self.speed)

    async def _execute_node(
        self, class_type: str, inputs: dict[str, Any], ctx: _NodeContext
    ) -> tuple[list[Any], dict[str, Any] | None]:
        await self._sleep(self.node_delay + self.delays.get(class_type, 0.0))
        for index, failure in enumerate(self._failures):
            if failure.node_type in (None, class_type):
                del self._failures[index]
                raise _NodeFailed(failure.message, failure.exception_type)
        handler = getattr(self, f"_node_{class_type}", None)
        if handler is None:
            if class_type in SAMPLERS:
                handler = self._sampler
            elif re.fullmatch(r"Empty\w*Latent\w*", class_type):
                handler = self._empty_latent
            else:
                return self._generic(class_type, inputs), None
        return await handler(inputs, ctx)

    def _generic(self, class_type: str, inputs: dict[str, Any]) -> list[Any]:
        outputs = self._node_defs[class_type].get("output") or []
        result: list[Any] = []
        for out_type in outputs:
            same = next((v for v in inputs.values() if _value_type(v) == out_type), None)
            if same is not None:
                result.append(same)
            elif out_type == "IMAGE":
                result.append([Image.new("RGB", (64, 64))])
            elif out_type == "LATENT":
                result.append(_Latent(64, 64))
            else:
                result.append(f"<{out_type} from {class_type}>")
        return result

    # model-free nodes, for real

    async def _node_EmptyImage(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        color = int(i.get("color", 0))
        rgb = ((color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF)
        size = (int(i["width"]), int(i["height"]))
        return [[Image.new("RGB", size, rgb) for _ in range(int(i.get("batch_size", 1)))]], None

    async def _node_LoadImage(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        path = _annotated(self.dirs, str(i["image"]), "input")
        assert path is not None

        def load() -> tuple[Image.Image, Image.Image]:
            with Image.open(path) as img:
                img = ImageOps.exif_transpose(img)
                mask = (img.getchannel("A") if "A" in img.getbands()
                        else Image.new("L", img.size, 0))
                return img.convert("RGB"), mask

        try:
            image, mask = await asyncio.to_thread(load)
        except OSError as exc:
            raise _NodeFailed(f"cannot identify image file '{path.name}'",
                              "PIL.UnidentifiedImageError") from exc
        return [[image], [mask]], None

    async def _node_ImageInvert(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        return [[img.convert("RGB").point(_INVERT_LUT * 3) for img in i["image"]]], None

    async def _node_ImageScale(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        out = []
        for img in i["image"]:
            w, h = int(i["width"]), int(i["height"])
            if w == 0 and h == 0:
                out.append(img)
                continue
            w = w or max(1, round(img.width * h / img.height))
            h = h or max(1, round(img.height * w / img.width))
            out.append(img.resize((w, h)))
        return [out], None

    async def _node_ImageScaleToTotalPixels(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        out = []
        for img in i["image"]:
            scale = (float(i["megapixels"]) * 1024 * 1024 / (img.width * img.height)) ** 0.5
            out.append(img.resize((max(1, round(img.width * scale)),
                                   max(1, round(img.height * scale)))))
        return [out], None

    async def _node_SaveImage(self, i: dict[str, Any], ctx: _NodeContext) -> Any:
        images = await self._save_images(i["images"], str(i.get("filename_prefix", "ComfyUI")),
                                         "output", ctx)
        return [], {"images": images}

    async def _node_PreviewImage(self, i: dict[str, Any], ctx: _NodeContext) -> Any:
        # Drawn when the node object is made, and ComfyUI keeps node objects per node id
        # until it restarts: the same node of later prompts writes under the same prefix,
        # with the next free counter.
        suffix = self._preview_suffixes.setdefault(
            ctx.node_id, "".join(random.choice(string.ascii_lowercase) for _ in range(5))
        )
        images = await self._save_images(i["images"], f"ComfyUI_temp_{suffix}", "temp", ctx)
        return [], {"images": images}

    async def _node_SaveImageWebsocket(self, i: dict[str, Any], ctx: _NodeContext) -> Any:
        images = i["images"]
        for index, img in enumerate(images):
            png = _png(img)
            await ctx.step(index, len(images), png)
        return [], None

    async def _node_PreviewAny(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        return [], {"text": [str(i.get("source"))]}

    async def _save_images(
        self, images: list[Image.Image], prefix: str, kind: str, ctx: _NodeContext
    ) -> list[dict[str, str]]:
        if ".." in Path(prefix).parts or prefix.startswith("/"):
            raise _NodeFailed(
                "**** ERROR: Saving image outside the output folder is not allowed.\n"
                f" full_output_folder: {self.dirs[kind]}\n output_dir: {self.dirs[kind]}",
                "Exception",
            )
        subfolder, name = str(Path(prefix).parent), Path(prefix).name
        subfolder = "" if subfolder == "." else subfolder
        folder = self.dirs[kind] / subfolder
        folder.mkdir(parents=True, exist_ok=True)
        counter = _next_counter(folder, name)
        pnginfo = PngImagePlugin.PngInfo()
        pnginfo.add_text("prompt", json.dumps(ctx.job.prompt))
        for key, value in (ctx.job.extra_data.get("extra_pnginfo") or {}).items():
            pnginfo.add_text(key, json.dumps(value))
        results = []
        for offset, img in enumerate(images):
            filename = f"{name}_{counter + offset:05}_.png"
            await asyncio.to_thread(img.save, folder / filename, "PNG", pnginfo=pnginfo,
                                    compress_level=1)
            results.append({"filename": filename, "subfolder": subfolder, "type": kind})
        return results

    # model nodes, simulated

    async def _empty_latent(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        return [_Latent(int(i.get("width", 512)), int(i.get("height", 512)),
                        int(i.get("length", 1)), int(i.get("batch_size", 1)))], None

    async def _sampler(self, i: dict[str, Any], ctx: _NodeContext) -> Any:
        steps = int(i.get("steps", 1))
        first = int(i.get("start_at_step", 0))
        last = min(int(i.get("end_at_step", steps)), steps)
        total = max(last - first, 1)
        latent = i.get("latent_image")
        if not isinstance(latent, _Latent):
            latent = _Latent(64, 64)
        # A step's work grows with the latent's pixels, frames and batch, as on a GPU.
        megapixels = latent.width * latent.height / (1024 * 1024) * latent.length * latent.batch
        for step in range(total):
            await self._sleep(self.step_delay + self.step_cost * megapixels)
            # The real sampler's callback checks for an interrupt at every step, so a
            # cancel stops a long sampler at once, not after its last step.
            if self._interrupt:
                raise _Interrupted
            preview = (
                _png(Image.new("RGB", (8, 8), (step * 20 % 255, 0, 0))) if self.previews else None
            )
            await ctx.step(step + 1, total, preview, jpeg=True)
        return [latent], None

    async def _node_VAEDecode(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        latent = i.get("samples")
        if not isinstance(latent, _Latent):
            latent = _Latent(64, 64)
        count = latent.batch * max(1, (latent.length - 1) // 4 + 1 if latent.length > 1 else 1)
        colour = (40, 90, 160)
        size = (latent.width, latent.height)
        return [[Image.new("RGB", size, colour) for _ in range(count)]], None

    async def _node_VAEEncode(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        img = i["pixels"][0]
        return [_Latent(img.width, img.height, 1, len(i["pixels"]))], None

    async def _node_CreateVideo(self, i: dict[str, Any], _ctx: _NodeContext) -> Any:
        return [_Video(list(i["images"]), float(i.get("fps", 30)))], None

    async def _node_SaveVideo(self, i: dict[str, Any], ctx: _NodeContext) -> Any:
        video = i["video"]
        frames = video.frames if isinstance(video, _Video) else []
        prefix = str(i.get("filename_prefix", "video/ComfyUI"))
        subfolder, name = str(Path(prefix).parent), Path(prefix).name
        subfolder = "" if subfolder == "." else subfolder
        folder = self.dirs["output"] / subfolder
        folder.mkdir(parents=True, exist_ok=True)
        filename = f"{name}_{_next_counter(folder, name, 'mp4'):05}_.mp4"
        # ComfyUI's SaveVideo stores the prompt and the workflow as MP4 metadata tags
        metadata = {"prompt": ctx.job.prompt, **(ctx.job.extra_data.get("extra_pnginfo") or {})}
        fps = video.fps if isinstance(video, _Video) else 16.0
        await asyncio.to_thread(_write_mp4, folder / filename, frames, fps, metadata)
        return [], {"images": [{"filename": filename, "subfolder": subfolder, "type": "output"}],
                    "animated": [True]}


class _NodeContext:
    """What a node needs to report progress and previews."""

    def __init__(self, fake: FakeComfyUI, job: _Job, node_id: str, sid: str | None,
                 progress: dict[str, dict[str, Any]], state: Any) -> None:
        self.fake, self.job, self.node_id, self.sid = fake, job, node_id, sid
        self.progress, self.state = progress, state

    async def step(self, value: int, maximum: int, image: bytes | None = None,
                   jpeg: bool = False) -> None:
        """One progress-bar tick: progress_state, then progress and a preview frame."""
        fake, pid, node = self.fake, self.job.prompt_id, self.node_id
        if fake._interrupt:
            raise _Interrupted
        self.progress[node] = self.state(node, value, maximum, "running")
        # With no client_id the real server sends these to every socket.
        await fake._send("progress_state", {"prompt_id": pid, "nodes": dict(self.progress)},
                         self.sid)
        progress = {"value": value, "max": maximum, "prompt_id": pid, "node": node}
        metadata = fake.socket_flags.get(self.sid, {}).get("supports_preview_metadata")
        if image is not None and metadata:
            meta = json.dumps({"node_id": node, "prompt_id": pid, "display_node_id": node,
                               "parent_node_id": None, "real_node_id": node,
                               "image_type": "image/png"}).encode()
            await fake._send_bytes(struct.pack(">II", 4, len(meta)) + meta + image, self.sid)
        await fake._send("progress", progress, self.sid)
        if image is not None and not metadata:
            await fake._send_bytes(struct.pack(">II", 1, 2) + image, self.sid)


# --- helpers ------------------------------------------------------------------------------


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def _server_error() -> web.Response:
    text = "500 Internal Server Error\n\nServer got itself in trouble"
    return web.Response(status=500, text=text)


def _origin_mismatch(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    host = request.headers.get("Host", "")
    if not origin or not host:
        return False
    host_name = host.rsplit(":", 1)[0].strip("[]")
    if host_name not in ("127.0.0.1", "localhost", "::1"):
        return False
    parsed = urlsplit(origin)
    return parsed.netloc != host


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], int)


def _input_specs(definition: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    specs = []
    for category in ("required", "optional"):
        for name, spec in (definition.get("input", {}).get(category) or {}).items():
            specs.append((name, spec, category))
    return specs


def _type_name(input_type: Any) -> str:
    return "COMBO" if isinstance(input_type, list) else str(input_type)


def _types_match(received: Any, input_type: Any) -> bool:
    if received is None:
        return False
    wanted = _type_name(input_type)
    if "*" in (received, wanted) or received == wanted:
        return True
    if wanted == "COMBO" and received in ("STRING", "COMBO"):
        return True
    got, want = set(str(received).split(",")), set(wanted.split(","))
    return bool(got & want)


def _value_type(value: Any) -> str | None:
    if isinstance(value, _Latent):
        return "LATENT"
    if isinstance(value, list) and value and isinstance(value[0], Image.Image):
        return "IMAGE" if value[0].mode != "L" else "MASK"
    if isinstance(value, _Video):
        return "VIDEO"
    if isinstance(value, str) and value.startswith("<"):
        return value[1:].split(" ", 1)[0]
    return None


def _execution_order(prompt: dict[str, Any], outputs: list[str]) -> list[str]:
    order: list[str] = []
    seen: set[str] = set()

    def visit(node_id: str) -> None:
        if node_id in seen:
            return
        seen.add(node_id)
        for value in (prompt[node_id].get("inputs") or {}).values():
            if _is_link(value):
                visit(str(value[0]))
        order.append(node_id)

    for out in sorted(outputs, key=lambda n: (len(n), n)):
        visit(out)
    return order


def _annotated(dirs: dict[str, Path], name: str, default: str) -> Path | None:
    kind = default
    found = re.fullmatch(r"(.*) \[(input|output|temp)\]", name)
    if found:
        name, kind = found[1], found[2]
    base = dirs[kind].resolve()
    path = (base / name).resolve()
    return path if path.is_relative_to(base) else None


def _next_counter(folder: Path, name: str, ext: str = "png") -> int:
    pattern = re.compile(rf"{re.escape(name)}_(\d+)_\.{ext}$")
    numbers = [int(m[1]) for p in folder.iterdir() if (m := pattern.match(p.name))]
    return max(numbers, default=0) + 1


def _write_mp4(path: Path, frames: list[Image.Image], fps: float,
               metadata: dict[str, Any]) -> None:
    """A playable H.264 MP4 written as ComfyUI's SaveVideo writes it (PyAV, yuv420p, the
    metadata as `udta` tags), fast: the fastest preset, one thread."""
    frames = frames or [Image.new("RGB", (16, 16))]
    width, height = frames[0].width // 2 * 2 or 2, frames[0].height // 2 * 2 or 2
    with av.open(str(path), mode="w", options={"movflags": "use_metadata_tags"}) as out:
        for key, value in metadata.items():
            out.metadata[key] = json.dumps(value)
        stream = out.add_stream("h264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "threads": "1"}
        for img in frames:
            frame = av.VideoFrame.from_image(img.convert("RGB").resize((width, height)))
            out.mux(stream.encode(frame))
        out.mux(stream.encode())


def _png(img: Image.Image) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


def _recode(data: bytes, preview: str | None, channel: str | None) -> tuple[bytes, str]:
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        if channel == "rgb":
            img = img.convert("RGB")
        elif channel == "a":
            alpha = img.getchannel("A") if "A" in img.getbands() else Image.new("L", img.size, 255)
            img = Image.merge("RGBA", (alpha, alpha, alpha, alpha))
        buffer = io.BytesIO()
        if preview:
            fmt, _, quality = preview.partition(";")
            fmt = "jpeg" if fmt not in ("webp", "jpeg") else fmt
            img.convert("RGB").save(buffer, fmt.upper(), quality=int(quality or 90))
            return buffer.getvalue(), f"image/{fmt}"
        img.save(buffer, "PNG")
        return buffer.getvalue(), "image/png"
