"""Plain records of one benchmark: what ran where, how long it took, and on what.

The runner produces a `BenchResult`; the report module and `bench compare` read one.
`to_json()` gives the document written as results.json (its shape is pinned by
`schema.json` in this package, versioned by `SCHEMA_VERSION`), `from_json()` reads one
back, so a results file from another machine can be compared with ours.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any, Literal

from comfyveil.errors import UsageError

SCHEMA_VERSION = 1

Mode = Literal["sequential", "parallel"]
Metric = Literal["server", "wall"]


class ResultsFileError(UsageError):
    """The file is not a comfyveil benchmark results file."""


@dataclass(frozen=True)
class NodeTime:
    """How long one node of the graph ran, measured between `executing` events."""

    node: str
    class_type: str | None
    seconds: float


@dataclass(frozen=True)
class RunRecord:
    """One measured run of one workflow on one backend (warm-up runs are never recorded).

    Times are seconds. `wall_s` runs from submitting the prompt to the job's final
    event; `execution_s` is the server's own figure (execution_start to
    execution_success timestamps). A failed run keeps its error and whatever was
    measured before it failed.
    """

    workflow: str
    backend: str
    run: int
    seed: int | None
    ok: bool
    error: str | None = None
    wall_s: float | None = None
    execution_s: float | None = None
    upload_s: float = 0.0
    download_s: float = 0.0
    nodes: tuple[NodeTime, ...] = ()
    sampler_its: float | None = None
    outputs: int = 0
    output_bytes: int = 0
    cached_nodes: int = 0
    prompt_id: str | None = None
    started_at: float | None = None  # epoch seconds, for ordering parallel runs

    def seconds(self, metric: Metric) -> float | None:
        """The headline duration: the server's time, else wall time when the server gave none."""
        if metric == "server" and self.execution_s is not None:
            return self.execution_s
        return self.wall_s


@dataclass(frozen=True)
class BackendEnv:
    """One backend and the machine behind it, from its /system_stats."""

    name: str
    url: str
    gpu: str | None = None
    vram_bytes: int | None = None
    comfyui_version: str | None = None
    pytorch_version: str | None = None
    python_version: str | None = None
    os: str | None = None
    error: str | None = None  # why /system_stats could not be read


@dataclass(frozen=True)
class WorkflowInfo:
    """A benchmarked workflow and the fixed parameters every run used."""

    name: str
    hash: str
    kind: str
    seed_param: str | None
    params: Mapping[str, Any] = field(default_factory=dict)
    input_image: str | None = None  # sha256 of the input image, when the workflow takes one


@dataclass(frozen=True)
class ParallelSummary:
    """Throughput when every backend pulled runs from one shared queue."""

    wall_s: float
    outputs: int
    outputs_per_minute: float
    runs_per_backend: Mapping[str, int]
    outputs_per_backend: Mapping[str, int]


@dataclass(frozen=True)
class BenchResult:
    """Everything one `comfyveil bench` invocation measured."""

    started_at: str  # ISO 8601, UTC
    finished_at: str
    mode: Mode
    metric: Metric
    runs: int
    warmup: int
    seed_base: int
    backends: tuple[BackendEnv, ...]
    workflows: tuple[WorkflowInfo, ...]
    records: tuple[RunRecord, ...]
    parallel: ParallelSummary | None = None
    tool_version: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def failed(self) -> tuple[RunRecord, ...]:
        return tuple(r for r in self.records if not r.ok)

    def records_for(self, workflow: str, backend: str) -> list[RunRecord]:
        return [r for r in self.records if r.workflow == workflow and r.backend == backend]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for wf in doc["workflows"]:
            wf["params"] = dict(wf["params"])
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> BenchResult:
        """Read a results document; refuses other formats and newer schema versions."""
        if not isinstance(doc, Mapping) or "schema_version" not in doc:
            raise ResultsFileError()
        version = doc["schema_version"]
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ResultsFileError(
                f"the results file has schema version {version}; this comfyveil reads up to "
                f"{SCHEMA_VERSION}, so upgrade comfyveil to compare it"
            )
        try:
            parallel = doc.get("parallel")
            return cls(
                schema_version=version,
                tool_version=str(doc.get("tool_version", "")),
                started_at=doc["started_at"],
                finished_at=doc["finished_at"],
                mode=doc["mode"],
                metric=doc["metric"],
                runs=int(doc["runs"]),
                warmup=int(doc["warmup"]),
                seed_base=int(doc["seed_base"]),
                backends=tuple(BackendEnv(**b) for b in doc["backends"]),
                workflows=tuple(WorkflowInfo(**w) for w in doc["workflows"]),
                records=tuple(
                    RunRecord(**{**r, "nodes": tuple(NodeTime(**n) for n in r["nodes"])})
                    for r in doc["records"]
                ),
                parallel=ParallelSummary(**parallel) if parallel else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsFileError(
                "the results file is damaged: a field is missing or has the wrong type"
            ) from exc


def schema() -> dict[str, Any]:
    """The JSON schema of results.json, shipped as package data."""
    text = resources.files("comfyveil.bench").joinpath("schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded
