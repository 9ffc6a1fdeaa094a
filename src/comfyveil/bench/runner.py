"""Run workflows on backends and return plain records; printing is report.py's job.

Cache and seeds: ComfyUI caches every node whose inputs did not change, so running
the same prompt twice measures nothing (the second run finishes in milliseconds).
Every run therefore gets its own seed, and the same seed on every backend: measured
run i uses `seed_base + i`, warm-up run j uses `seed_base - 1 - j` (never one a
measured run uses). A new seed makes the sampler and everything after it run again,
while loaders and text encoders stay cached after the warm-up, as they do for a chat
user asking again. A sampler seed that no parameter sets gets the run's seed written
into the graph, and a workflow with no sampler at all uploads its input image with the
run's seed in a PNG text chunk (new bytes, so LoadImage and all after it run again).
A run that still comes back from the cache (every node, or a sampler, in
`execution_cached`) measured nothing: it is refused as a failed run, never averaged.

Sequential mode (the default) runs each workflow on one backend at a time, so the
backends do not compete for the host. Parallel mode warms every backend up, then lets
all of them pull runs from one shared queue, which measures what the machine
delivers as a whole (the seed's "two GPUs in one server").
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import io
import logging
import random
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from comfyveil import __version__
from comfyveil import tasks as background
from comfyveil.bench import records, timing
from comfyveil.comfy.template import SEED_INPUTS
from comfyveil.errors import ComfyveilError, UsageError

logger = logging.getLogger(__name__)

DEFAULT_RUNS = 3
DEFAULT_WARMUP = 1
DEFAULT_SEED = 42
DEFAULT_TIMEOUT = 1800.0  # seconds one run may take (Wan video on a slow GPU takes minutes)
REQUEST_TIMEOUT = 60.0  # seconds for one HTTP request (a whole run has DEFAULT_TIMEOUT)
PROBE_TIMEOUT = 5.0  # seconds to decide whether a backend that failed a run is still up
INPUT_IMAGE_NAME = "comfyveil-bench.png"
# The same text on every backend and every run; the seed is what changes.
BENCH_PROMPTS = {
    "image": "a red fox standing in fresh snow at dawn, detailed photograph",
    "video": "a red fox walking through fresh snow at dawn, slow camera pan",
    "edit": "turn the square into a red circle",
}

CACHED_RUN = (
    "ComfyUI answered this run from its cache (its sampler did not run), so it measured "
    "nothing and is left out; give the workflow a seed parameter or an input that changes "
    "per run (comfyveil workflows check names a fixed seed)"
)

ProxyFor = Callable[[str, str], "str | None"]


def direct(name: str, url: str) -> str | None:
    """The default route: straight to the backend, no proxy."""
    return None


@dataclass(frozen=True)
class Backend:
    name: str
    url: str


class Client(Protocol):
    """What the runner needs from `comfyveil.comfy.client.ComfyClient`."""

    async def run(
        self, prompt: dict[str, Any], *, prompt_id: str | None = None,
        on_event: Callable[[Any], Any] | None = None,
    ) -> Any: ...

    async def upload_image(self, data: bytes, filename: str) -> Any: ...

    async def download(self, file: Any) -> bytes: ...

    async def system_stats(self) -> Any: ...


ClientFactory = Callable[[Backend, "str | None", float], AbstractAsyncContextManager[Client]]


def _comfy_client(backend: Backend, proxy: str | None, timeout: float) -> Any:
    from comfyveil.comfy import client

    return client.ComfyClient(
        backend.url, name=backend.name, timeout=min(timeout, REQUEST_TIMEOUT), proxy=proxy
    )


@dataclass(frozen=True)
class Progress:
    """One step of the benchmark, for a live display."""

    kind: Literal["run_started", "run_done"]
    workflow: str
    backend: str
    run: int
    warmup: bool
    record: records.RunRecord | None = None


ProgressListener = Callable[[Progress], None]


@dataclass(frozen=True)
class Plan:
    """What to benchmark. `workflows` are `comfyveil.comfy.workflow.Workflow` objects."""

    backends: tuple[Backend, ...]
    workflows: tuple[Any, ...]
    runs: int = DEFAULT_RUNS
    warmup: int = DEFAULT_WARMUP
    values: Mapping[str, Any] = field(default_factory=dict)  # fixed --set parameters
    image: bytes | None = None  # input image for editing workflows; else a generated one
    seed_base: int = DEFAULT_SEED
    parallel: bool = False
    metric: records.Metric = "server"
    timeout: float = DEFAULT_TIMEOUT

    @property
    def total_runs(self) -> int:
        """Runs the live display counts, warm-up included."""
        per_backend = len(self.workflows) * (self.runs + self.warmup)
        return per_backend * len(self.backends)


def sample_image(size: int = 512) -> bytes:
    """A deterministic input image (a gradient with a square), the same on every machine."""
    from PIL import Image, ImageDraw

    vertical = Image.linear_gradient("L").resize((size, size))
    horizontal = vertical.transpose(Image.Transpose.ROTATE_90)
    image = Image.merge("RGB", (horizontal, vertical, Image.new("L", (size, size), 128)))
    ImageDraw.Draw(image).rectangle(
        (size // 4, size // 4, 3 * size // 4, 3 * size // 4), fill=(240, 240, 240)
    )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _get(source: Any, key: str) -> Any:
    if isinstance(source, Mapping):
        return source.get(key)
    return getattr(source, key, None)


def environment(backend: Backend, stats: Any) -> records.BackendEnv:
    """The machine behind a backend, from its /system_stats answer (a dict or a record)."""
    system = _get(stats, "system") or stats
    devices = _get(stats, "devices") or []
    device = devices[0] if devices else None
    vram = _get(device, "vram_total") if device is not None else None
    return records.BackendEnv(
        name=backend.name,
        url=backend.url,
        gpu=_get(device, "name") if device is not None else None,
        vram_bytes=int(vram) if isinstance(vram, (int, float)) else None,
        comfyui_version=_get(system, "comfyui_version"),
        pytorch_version=_get(system, "pytorch_version"),
        python_version=_get(system, "python_version"),
        os=_get(system, "os"),
    )


def _seed_params(wf: Any) -> list[str]:
    """The parameters that set a sampler's seed (an int bound to one counts too)."""
    names = getattr(wf, "seed_params", None)
    if names is not None:
        return list(names)
    return [name for name, p in wf.params.items() if p.type == "seed"]


def _fixed_seeds(wf: Any) -> list[tuple[str, str]]:
    """(node, input) of the sampler seeds no parameter sets."""
    fixed = getattr(wf, "fixed_seeds", None)
    return [(node, name) for node, _class, name in fixed()] if callable(fixed) else []


def _seeded(wf: Any) -> bool:
    """Whether a run's seed reaches the graph (through a parameter or written into it)."""
    return bool(_seed_params(wf) or _fixed_seeds(wf))


def _tagged_png(data: bytes, seed: int) -> bytes:
    """`data` (a PNG) with a text chunk naming the run: the same pixels, new bytes, so
    ComfyUI's LoadImage (whose cache key is the file's hash) loads it again."""
    signature = b"\x89PNG\r\n\x1a\n"
    if not data.startswith(signature) or not data.endswith(b"IEND\xaeB`\x82"):
        return data  # not a PNG we can tag; a cached run is refused afterwards
    body = b"tEXt" + b"comfyveil-bench-run\x00" + str(seed).encode()
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    return data[:-12] + chunk + data[-12:]


def _cache_answered(graph: Mapping[str, Any], cached: set[str]) -> bool:
    """Whether ComfyUI answered the run from its cache: every node, or a node that samples
    with a seed, listed in `execution_cached`."""
    if not cached:
        return False
    if set(graph) <= cached:
        return True
    return any(
        node in cached and SEED_INPUTS & set(graph[node].get("inputs") or {})
        for node in graph
    )


def _seed_param(wf: Any) -> str | None:
    names = _seed_params(wf)
    return names[0] if names else None


def _has_param(wf: Any, name: str) -> bool:
    try:
        wf.param(name)
    except ComfyveilError:
        return False
    return True


def check_values(workflows: Sequence[Any], values: Mapping[str, Any]) -> None:
    """Refuse a --set name that no workflow has (a typo would otherwise do nothing).

    Raises:
        UsageError: naming the parameter.
    """
    for key in values:
        if not any(_has_param(wf, key) for wf in workflows):
            raise UsageError(f"no benchmarked workflow has a parameter called {key}")


def _image_params(wf: Any) -> list[str]:
    return list(getattr(wf, "image_params", None) or ())


def _class_types(graph: Mapping[str, Any]) -> dict[str, str]:
    return {
        str(node): str(spec.get("class_type"))
        for node, spec in graph.items()
        if isinstance(spec, Mapping) and spec.get("class_type")
    }


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ComfyveilError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "the run took longer than the time limit"
    return f"connection problem: {exc.__class__.__name__}"


@dataclass
class _BackendState:
    backend: Backend
    client: Client | None = None
    env: records.BackendEnv | None = None
    down: str | None = None  # why no more runs are sent here


class Runner:
    """Runs one `Plan`. Use `await Runner(plan).run()`; see `run()` below."""

    def __init__(
        self,
        plan: Plan,
        *,
        proxy_for: ProxyFor = direct,
        on_progress: ProgressListener | None = None,
        client_factory: ClientFactory = _comfy_client,
    ) -> None:
        if plan.runs < 1:
            raise ValueError("runs must be at least 1")
        if not plan.backends or not plan.workflows:
            raise ValueError("a plan needs at least one backend and one workflow")
        self.plan = plan
        self._proxy_for = proxy_for
        self._on_progress = on_progress or (lambda _: None)
        self._client_factory = client_factory
        self._image = plan.image
        self._records: list[records.RunRecord] = []

    async def run(self) -> records.BenchResult:
        """Raises ParamError (a UsageError) before anything runs when a value is bad."""
        infos = tuple(self._workflow_info(wf) for wf in self.plan.workflows)
        started = _now()
        states = [_BackendState(b) for b in self.plan.backends]
        parallel: records.ParallelSummary | None = None
        async with contextlib.AsyncExitStack() as stack:
            await asyncio.gather(*(self._open(stack, s) for s in states))
            if self.plan.parallel:
                parallel = await self._run_parallel(states)
            else:
                await self._run_sequential(states)
        return records.BenchResult(
            started_at=started,
            finished_at=_now(),
            mode="parallel" if self.plan.parallel else "sequential",
            metric=self.plan.metric,
            runs=self.plan.runs,
            warmup=self.plan.warmup,
            seed_base=self.plan.seed_base,
            backends=tuple(
                s.env or records.BackendEnv(s.backend.name, s.backend.url, error=s.down)
                for s in states
            ),
            workflows=infos,
            records=tuple(self._records),
            parallel=parallel,
            tool_version=__version__,
        )

    async def _open(self, stack: contextlib.AsyncExitStack, state: _BackendState) -> None:
        backend = state.backend
        try:
            proxy = self._proxy_for(backend.name, backend.url)
            client = await stack.enter_async_context(
                self._client_factory(backend, proxy, self.plan.timeout)
            )
            stats = await background.wait_for(client.system_stats(), PROBE_TIMEOUT * 6)
        except (ComfyveilError, OSError, TimeoutError) as exc:
            text = _error_text(exc)
            state.down = (
                text if backend.name in text
                else f"backend {backend.name} could not be reached: {text}"
            )
            logger.info("backend %s unreachable at start", backend.name)
            return
        state.client = client
        state.env = environment(backend, stats)

    def _workflow_info(self, wf: Any) -> records.WorkflowInfo:
        return records.WorkflowInfo(
            name=wf.name,
            hash=str(wf.hash),
            kind=str(getattr(wf, "kind", "image")),
            seed_param=_seed_param(wf),
            params=self._recorded_params(wf),
            input_image=(
                hashlib.sha256(self._input_image()).hexdigest() if _image_params(wf) else None
            ),
        )

    def _recorded_params(self, wf: Any) -> dict[str, Any]:
        """What every run used, seeds and uploaded image names left out."""
        values = self._values(wf, self.plan.seed_base)
        values.update({name: INPUT_IMAGE_NAME for name in _image_params(wf)})
        values = wf.validate(values, rng=random.Random(self.plan.seed_base))
        skip = set(_seed_params(wf)) | set(_image_params(wf))
        return {k: v for k, v in values.items() if k not in skip}

    def _values(self, wf: Any, seed: int | None) -> dict[str, Any]:
        """The fixed parameters of a run: --set values, a stock prompt, the run's seed."""
        values: dict[str, Any] = {}
        for key, value in self.plan.values.items():
            if _has_param(wf, key):
                values[wf.param(key).name] = value
        prompt = wf.prompt_param
        if prompt and prompt not in values:
            kind = "edit" if _image_params(wf) else str(wf.kind)
            values[prompt] = BENCH_PROMPTS.get(kind, BENCH_PROMPTS["image"])
        for name in _seed_params(wf):
            values[name] = seed
        return values

    def _input_image(self) -> bytes:
        if self._image is None:
            self._image = sample_image()
        return self._image

    async def _run_sequential(self, states: Sequence[_BackendState]) -> None:
        for wf in self.plan.workflows:
            for state in states:
                for j in range(self.plan.warmup):
                    await self._one(state, wf, index=j, warmup=True)
                for i in range(self.plan.runs):
                    self._records.append(await self._one(state, wf, index=i, warmup=False))

    async def _run_parallel(self, states: Sequence[_BackendState]) -> records.ParallelSummary:
        async def warm(state: _BackendState) -> None:
            for wf in self.plan.workflows:
                for j in range(self.plan.warmup):
                    await self._one(state, wf, index=j, warmup=True)

        await asyncio.gather(*(warm(s) for s in states))
        queue: asyncio.Queue[tuple[Any, int]] = asyncio.Queue()
        for wf in self.plan.workflows:
            for i in range(self.plan.runs * len(states)):
                queue.put_nowait((wf, i))

        async def pull(state: _BackendState) -> None:
            while state.down is None:
                try:
                    wf, i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                self._records.append(await self._one(state, wf, index=i, warmup=False))

        began = time.monotonic()
        await asyncio.gather(*(pull(s) for s in states))
        wall = time.monotonic() - began
        # Runs no backend could take (every one went down) are reported, not dropped.
        while not queue.empty():
            wf, i = queue.get_nowait()
            reasons = "; ".join(s.down or "" for s in states)
            self._records.append(self._not_run(wf, "-", i, f"not run: {reasons}"))
        ok = [r for r in self._records if r.ok]
        outputs = sum(r.outputs for r in ok)
        return records.ParallelSummary(
            wall_s=wall,
            outputs=outputs,
            outputs_per_minute=outputs / (wall / 60) if wall > 0 else 0.0,
            runs_per_backend={s.backend.name: sum(
                1 for r in ok if r.backend == s.backend.name) for s in states},
            outputs_per_backend={s.backend.name: sum(
                r.outputs for r in ok if r.backend == s.backend.name) for s in states},
        )

    def _seed(self, index: int, warmup: bool) -> int:
        return self.plan.seed_base - 1 - index if warmup else self.plan.seed_base + index

    def _not_run(self, wf: Any, backend: str, index: int, why: str) -> records.RunRecord:
        return records.RunRecord(
            workflow=wf.name, backend=backend, run=index,
            seed=self._seed(index, False) if _seeded(wf) else None, ok=False, error=why,
        )

    async def _one(
        self, state: _BackendState, wf: Any, *, index: int, warmup: bool
    ) -> records.RunRecord:
        name = state.backend.name
        if state.down is not None or state.client is None:
            record = self._not_run(wf, name, index, state.down or "backend not available")
            self._on_progress(Progress("run_done", wf.name, name, index, warmup, record))
            return record
        self._on_progress(Progress("run_started", wf.name, name, index, warmup))
        record = await self._measure(state.client, state.backend, wf, index, warmup)
        if not record.ok and not await self._still_up(state.client):
            state.down = f"backend {name} stopped answering after: {record.error}"
            logger.info("backend %s stopped answering", name)
        self._on_progress(Progress("run_done", wf.name, name, index, warmup, record))
        return record

    async def _still_up(self, client: Client) -> bool:
        try:
            await background.wait_for(client.system_stats(), PROBE_TIMEOUT)
        except (ComfyveilError, OSError, TimeoutError):
            return False
        return True

    async def _measure(
        self, client: Client, backend: Backend, wf: Any, index: int, warmup: bool
    ) -> records.RunRecord:
        run_seed = self._seed(index, warmup)
        seed = run_seed if _seeded(wf) else None
        values = self._values(wf, seed)
        started_at = time.time()
        partial: dict[str, Any] = {}
        timer = timing.RunTimer()
        try:
            image_params = _image_params(wf)
            if image_params:
                t = time.monotonic()
                image = self._input_image()
                if seed is None:
                    image = _tagged_png(image, run_seed)
                for param in image_params:
                    uploaded = await client.upload_image(image, INPUT_IMAGE_NAME)
                    values[param] = _get(uploaded, "reference") or _get(uploaded, "name")
                partial["upload_s"] = time.monotonic() - t
            graph = wf.apply(wf.validate(values, rng=random.Random(run_seed)))
            for node, name in _fixed_seeds(wf):
                graph[node]["inputs"][name] = run_seed
            timer.class_types = _class_types(graph)
            prompt_id = str(uuid.uuid4())
            partial["prompt_id"] = prompt_id
            t = time.monotonic()
            result = await background.wait_for(
                client.run(graph, prompt_id=prompt_id, on_event=timer.on_event),
                self.plan.timeout,
            )
            partial["wall_s"] = time.monotonic() - t
            _raise_for_status(result)
            t = time.monotonic()
            sizes = [len(await client.download(f)) for f in _get(result, "outputs") or ()]
            partial["download_s"] = time.monotonic() - t
        except (ComfyveilError, OSError, TimeoutError) as exc:
            return records.RunRecord(
                workflow=wf.name, backend=backend.name, run=index, seed=seed, ok=False,
                error=_error_text(exc), nodes=timer.nodes(), started_at=started_at,
                execution_s=timer.execution_s, cached_nodes=len(timer.cached), **partial,
            )
        cached = _cached_set(result, timer)
        if _cache_answered(graph, cached):
            return records.RunRecord(
                workflow=wf.name, backend=backend.name, run=index, seed=seed, ok=False,
                error=CACHED_RUN, nodes=(), started_at=started_at,
                cached_nodes=len(cached), **partial,
            )
        return records.RunRecord(
            workflow=wf.name, backend=backend.name, run=index, seed=seed, ok=True,
            execution_s=_server_seconds(result, timer), nodes=_nodes(result, timer),
            sampler_its=timer.sampler_its(), outputs=len(sizes), output_bytes=sum(sizes),
            cached_nodes=_cached(result, timer), started_at=started_at, **partial,
        )


class _RunFailed(ComfyveilError):
    """The backend reported that the run failed."""


def _raise_for_status(result: Any) -> None:
    """Raise the client's plain-words error for a run that ended badly."""
    check = getattr(result, "raise_for_status", None)
    if callable(check):
        check()
        return
    status = _get(result, "status")
    if status not in (None, "success"):
        error = _get(result, "error")
        raise _RunFailed(str(error) if error else f"the run ended with status {status}")


def _nodes(result: Any, timer: timing.RunTimer) -> tuple[records.NodeTime, ...]:
    """Per-node times: the client's, when it measured them, else our own."""
    timings = _get(result, "timings")
    node_ms = _get(timings, "node_ms") if timings is not None else None
    if not node_ms:
        return timer.nodes()
    cached = set(_get(timings, "cached_nodes") or ()) | timer.cached
    return tuple(
        records.NodeTime(str(node), timer.class_types.get(str(node)), ms / 1000)
        for node, ms in node_ms.items()
        if str(node) not in cached
    )


def _cached_set(result: Any, timer: timing.RunTimer) -> set[str]:
    timings = _get(result, "timings")
    return {str(n) for n in _get(timings, "cached_nodes") or ()} | set(timer.cached)


def _cached(result: Any, timer: timing.RunTimer) -> int:
    return len(_cached_set(result, timer))


def _server_seconds(result: Any, timer: timing.RunTimer) -> float | None:
    timings = _get(result, "timings")
    start = _get(timings, "execution_start_ms") if timings is not None else None
    end = _get(timings, "execution_end_ms") if timings is not None else None
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        return max(0.0, (end - start) / 1000)
    return timer.execution_s


async def run(
    plan: Plan,
    *,
    proxy_for: ProxyFor = direct,
    on_progress: ProgressListener | None = None,
    client_factory: ClientFactory = _comfy_client,
) -> records.BenchResult:
    """Benchmark `plan` and return every measured run, failed ones included.

    `proxy_for(name, url)` returns the proxy URL to reach a backend through (for
    example anon's SOCKS port for a hidden service) or None for a direct connection.
    A backend that cannot be reached or stops answering is not retried: its
    remaining runs are recorded as failed with the reason.
    """
    return await Runner(
        plan, proxy_for=proxy_for, on_progress=on_progress, client_factory=client_factory
    ).run()

