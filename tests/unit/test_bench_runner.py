"""The runner against an in-process stand-in for the ComfyUI client (no sockets).

The real client and the fake ComfyUI server are exercised in
tests/integration/test_bench.py; here we check the runner's own rules quickly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from comfyveil.bench import records, runner
from comfyveil.comfy import errors, events, workflow
from comfyveil.errors import UsageError

GRAPH = {
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
    "3": {"class_type": "KSampler", "inputs": {"seed": 1, "steps": 4, "latent_image": ["5", 0]}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "b"}},
}
TOML = """
command = "tiny"
kind = "image"
[params.seed]
node = "3"
input = "seed"
type = "seed"
[params.steps]
node = "3"
input = "steps"
type = "int"
min = 1
max = 50
"""


def tiny() -> workflow.Workflow:
    return workflow.loads("tiny", TOML, json.dumps(GRAPH))


@dataclass
class StubResult:
    prompt_id: str
    status: str
    outputs: list[str]
    error: str | None = None


@dataclass
class StubClient:
    name: str
    fail_from: int | None = None  # the n-th prompt (0-based) and later fail; the server is gone
    prompts: list[dict[str, Any]] = field(default_factory=list)
    dead: bool = False

    async def system_stats(self) -> dict[str, Any]:
        if self.dead:
            raise errors.BackendUnreachable(backend=self.name)
        return {"system": {"comfyui_version": "0.3.64", "os": "posix"},
                "devices": [{"name": f"stub {self.name}", "vram_total": 1024}]}

    async def run(self, prompt: dict[str, Any], *, prompt_id: str | None = None,
                  on_event: Callable[[Any], Any] | None = None) -> StubResult:
        if self.dead or (self.fail_from is not None and len(self.prompts) >= self.fail_from):
            self.dead = True
            raise errors.BackendUnreachable(backend=self.name)
        self.prompts.append(prompt)
        emit = on_event or (lambda _e: None)
        pid = prompt_id or "x"
        emit(events.ExecutionStart(pid, 1000))
        emit(events.Executing(pid, "3"))
        emit(events.Executing(pid, "9"))
        emit(events.ExecutionSuccess(pid, 1250))
        emit(events.Executing(pid, None))
        return StubResult(pid, "success", ["out.png"])

    async def upload_image(self, data: bytes, filename: str) -> dict[str, str]:
        return {"name": filename}

    async def download(self, file: Any) -> bytes:
        return b"\x89PNG" + b"0" * 96


def factory(clients: dict[str, StubClient]) -> runner.ClientFactory:
    @asynccontextmanager
    async def make(backend: runner.Backend, proxy: str | None,
                   _timeout: float) -> AsyncIterator[StubClient]:
        yield clients[backend.name]

    return make  # type: ignore[return-value]


def plan(**kw: Any) -> runner.Plan:
    base: dict[str, Any] = {
        "backends": (runner.Backend("a", "http://127.0.0.1:1"),
                     runner.Backend("b", "http://127.0.0.1:2")),
        "workflows": (tiny(),), "runs": 3, "warmup": 2,
    }
    return runner.Plan(**{**base, **kw})


def seeds(client: StubClient) -> list[int]:
    return [p["3"]["inputs"]["seed"] for p in client.prompts]


async def test_warmups_run_but_are_not_recorded_and_seeds_match_across_backends() -> None:
    clients = {"a": StubClient("a"), "b": StubClient("b")}
    result = await runner.run(plan(values={"steps": "7"}), client_factory=factory(clients))
    assert len(clients["a"].prompts) == 5 and len(clients["b"].prompts) == 5
    assert len(result.records) == 6 and all(r.ok for r in result.records)
    # Warm-up seeds never coincide with measured ones (ComfyUI would serve those from cache).
    assert seeds(clients["a"]) == [41, 40, 42, 43, 44] == seeds(clients["b"])
    assert {p["3"]["inputs"]["steps"] for p in clients["a"].prompts} == {7}
    assert [r.seed for r in result.records_for("tiny", "a")] == [42, 43, 44]
    assert result.records[0].execution_s == pytest.approx(0.25)
    assert result.workflows[0].params == {"steps": 7}
    assert result.backends[1].gpu == "stub b"


async def test_a_backend_that_dies_is_reported_and_not_retried() -> None:
    clients = {"a": StubClient("a"), "b": StubClient("b", fail_from=3)}
    events_seen: list[runner.Progress] = []
    result = await runner.run(plan(), client_factory=factory(clients),
                              on_progress=events_seen.append)
    b_runs = result.records_for("tiny", "b")
    assert [r.ok for r in b_runs] == [True, False, False]
    assert "cannot be reached" in (b_runs[1].error or "")
    assert "stopped answering" in (b_runs[2].error or "")
    assert len(clients["b"].prompts) == 3  # 2 warm-ups + 1 good run; nothing after it died
    assert all(r.ok for r in result.records_for("tiny", "a"))
    assert sum(1 for e in events_seen if e.kind == "run_done") == plan().total_runs


async def test_an_unreachable_backend_still_appears_with_its_reason() -> None:
    clients = {"a": StubClient("a"), "b": StubClient("b", dead=True)}
    result = await runner.run(plan(warmup=0), client_factory=factory(clients))
    assert result.backends[1].error == "backend b cannot be reached"
    assert [r.ok for r in result.records_for("tiny", "b")] == [False] * 3


async def test_parallel_shares_the_queue() -> None:
    clients = {"a": StubClient("a"), "b": StubClient("b")}
    result = await runner.run(plan(parallel=True, warmup=1), client_factory=factory(clients))
    assert result.mode == "parallel" and result.parallel is not None
    assert len(result.records) == 6  # runs x backends, shared
    assert sorted(r.run for r in result.records) == list(range(6))
    assert sum(result.parallel.runs_per_backend.values()) == 6
    assert result.parallel.outputs == 6


def test_unknown_set_names_are_refused() -> None:
    with pytest.raises(UsageError, match="stepz"):
        runner.check_values([tiny()], {"stepz": "3"})
    runner.check_values([tiny()], {"steps": "3"})


def test_sample_image_is_a_deterministic_png() -> None:
    assert runner.sample_image() == runner.sample_image()
    assert runner.sample_image().startswith(b"\x89PNG")


def test_environment_from_system_stats() -> None:
    stats = {"system": {"comfyui_version": "0.3.64", "pytorch_version": "2.8.0+cu128",
                        "python_version": "3.11.7 (main)", "os": "posix"},
             "devices": [{"name": "cuda:0 NVIDIA GeForce RTX 5090 : cudaMallocAsync",
                          "vram_total": 34190917632}]}
    env = runner.environment(runner.Backend("g", "http://127.0.0.1:8188"), stats)
    assert env == records.BackendEnv(
        "g", "http://127.0.0.1:8188", "cuda:0 NVIDIA GeForce RTX 5090 : cudaMallocAsync",
        34190917632, "0.3.64", "2.8.0+cu128", "3.11.7 (main)", "posix")


async def test_a_bad_value_is_refused_before_anything_runs() -> None:
    clients = {"a": StubClient("a"), "b": StubClient("b")}
    with pytest.raises(UsageError, match="steps"):
        await runner.run(plan(values={"steps": "999"}), client_factory=factory(clients))
    assert clients["a"].prompts == [] and clients["b"].prompts == []
