"""Routing by expected finish time against the old idle-first rule, in one run.

    .venv/bin/python benchmarks/routing.py [--jobs 300] [--scale 0.25]

Two cases, each at 30 % and 80 % of the pool's capacity, with the same Poisson arrivals
(seeded) for both rules:

- speed: two fake backends, speeds 1.0 and 0.37 (the seed's RTX 4090 / 5090 ratio on
  Flux Schnell: 4.92 s / 1.80 s), one workflow;
- mixed: four equal backends, three workflows (Flux Schnell, Flux Dev, SD 3.5) whose
  model loads cost 3 s, simulated by the fake ComfyUI: its loader nodes take 3 s unless
  their output is still in its cache from the previous prompt, as on a real server.

Times are scaled by --scale (0.25: a 1 s run takes 0.25 s) so the run fits in minutes;
the figures are reported in unscaled seconds. Jobs are dispatched in arrival order, one
at a time, the way a worker claims them: a job that waits for a GPU holds up the rest.
The pool and the fake backends are real (HTTP and WebSocket on 127.0.0.1); the database
is left out, it does not take part in the choice of a GPU. The estimator starts empty:
the new rule learns each GPU's speed and each cold start while the run goes on.

Reports, per case, load and rule: mean and p95 time from queueing to result, model
switches (runs whose loaders were not cached), and the worst time over the median.
Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.fakes

from tests.fakes.comfyui import FakeComfyUI  # noqa: E402

from comfyveil import config  # noqa: E402
from comfyveil.comfy import events, execute, pool, workflow  # noqa: E402

RUN_SECONDS = 1.0  # one run on the speed-1.0 GPU, unscaled
LOAD_SECONDS = 3.0  # a model switch in the mixed case, unscaled
LOADERS = ("UNETLoader", "CheckpointLoaderSimple", "DualCLIPLoader", "VAELoader")


@dataclass(frozen=True)
class Case:
    name: str
    speeds: tuple[float, ...]
    commands: tuple[str, ...]
    load: float  # unscaled seconds a loader node takes when not cached

    def capacity(self) -> float:
        """Jobs a second the pool finishes with warm models (unscaled)."""
        return sum(1.0 / (RUN_SECONDS * s) for s in self.speeds)


CASES = (
    Case("speed", (1.0, 0.37), ("f",), 0.0),
    Case("mixed", (1.0, 1.0, 1.0, 1.0), ("f", "fd", "sd3"), LOAD_SECONDS),
)


def values_for(wf: workflow.Workflow, index: int) -> dict[str, object]:
    raw: dict[str, object] = {"prompt": f"routing bench {index}", "seed": index, "steps": 1}
    if "width" in wf.params:
        raw.update(width=256, height=256)
    return dict(wf.validate(raw))


async def run_once(
    case: Case, rule: str, load: float, jobs: int, scale: float, seed: int, tmp: Path
) -> dict[str, Any]:
    # The run's time is all in the sampler; a loader takes `load` when it must run. One
    # loader per workflow carries the load cost (the other loaders are shared or free).
    delays = {"KSampler": RUN_SECONDS * scale}
    for loader in ("UNETLoader", "CheckpointLoaderSimple"):
        delays[loader] = case.load * scale
    fakes = [
        FakeComfyUI(speed=speed, delays=dict(delays), root=tmp / f"{case.name}-{rule}-{i}")
        for i, speed in enumerate(case.speeds)
    ]
    for fake in fakes:
        await fake.start()
    configs = [
        config.BackendConfig(name=f"gpu{i}", url=f.url, via="direct", max_waiting=1)
        for i, f in enumerate(fakes)
    ]
    rng = random.Random(seed)
    rate = load * case.capacity() / scale  # arrivals a second, scaled time
    arrivals: list[float] = []
    at = 0.0
    for _ in range(jobs):
        at += rng.expovariate(rate)
        arrivals.append(at)
    commands = [rng.choice(case.commands) for _ in range(jobs)]
    flows = {c: workflow.find(c) for c in case.commands}
    done: dict[int, float] = {}
    placed: dict[int, str] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    tasks: set[asyncio.Task[None]] = set()
    try:
        async with pool.Pool(configs, probe_interval=0.5, routing=rule) as p:
            start = time.monotonic()

            async def run_job(index: int, slot: pool.Slot) -> None:
                wf = flows[commands[index]]
                released = False

                async def release() -> None:
                    nonlocal released
                    if not released:
                        released = True
                        await p.release(slot)

                async def on_event(event: events.Event) -> None:
                    # What the worker tells the pool: ComfyUI started the prompt, its steps.
                    if isinstance(event, events.ExecutionStart):
                        p.progress(slot, started=True)
                    elif isinstance(event, events.Progress) and event.max > 1:
                        p.progress(slot, done=float(event.value), steps=int(event.max))

                try:
                    outcome = await execute.execute(
                        slot.backend.client,
                        wf,
                        values_for(wf, index),
                        prompt_id=slot.job_id,
                        on_event=on_event,
                        on_ran=release,
                    )
                finally:
                    await release()
                p.learn(slot, outcome.result.timings)
                done[index] = time.monotonic() - start

            async def dispatch() -> None:
                for _ in range(jobs):
                    index = await queue.get()
                    wf = flows[commands[index]]
                    slot = await p.acquire(
                        wf, str(uuid.uuid4()), behind=queue.qsize(), params=values_for(wf, index)
                    )
                    placed[index] = slot.backend.name
                    task = asyncio.create_task(run_job(index, slot))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)

            dispatcher = asyncio.create_task(dispatch())
            for index, due in enumerate(arrivals):
                await asyncio.sleep(max(0.0, start + due - time.monotonic()))
                queue.put_nowait(index)
            await dispatcher
            while tasks:
                await asyncio.gather(*tasks)
        switches = 0
        for fake in fakes:
            for entry in fake.history_entries.values():
                cached: list[str] = []
                for name, data in entry["status"]["messages"]:
                    if name == "execution_cached":
                        cached = list(data.get("nodes") or [])
                graph = entry["prompt"][2]
                loaders = {n for n, node in graph.items() if node.get("class_type") in LOADERS}
                if loaders - set(cached):
                    switches += 1
    finally:
        for fake in fakes:
            await fake.stop()
    totals = sorted((done[i] - arrivals[i]) / scale for i in range(jobs))
    median = statistics.median(totals)
    return {
        "case": case.name,
        "rule": rule,
        "load": load,
        "jobs": jobs,
        "mean_s": round(statistics.fmean(totals), 3),
        "p95_s": round(totals[int(0.95 * (len(totals) - 1))], 3),
        "median_s": round(median, 3),
        "worst_over_median": round(totals[-1] / median, 2) if median > 0 else None,
        "switches": switches,
        "per_backend": {
            name: list(placed.values()).count(name) for name in sorted(set(placed.values()))
        },
        "estimates": [
            {"backend": e.backend, "workflow": e.workflow, "run": e.run, "cold_extra": e.cold_extra}
            for e in p.estimator.estimates()
        ],
    }


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cases", default="speed,mixed")
    parser.add_argument("--loads", default="0.3,0.8", help="fractions of the pool's capacity")
    args = parser.parse_args(argv)
    loads = [float(x) for x in args.loads.split(",")]
    logging.basicConfig(level=logging.ERROR)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="comfyveil-routing-") as tmpdir:
        for case in CASES:
            if case.name not in args.cases.split(","):
                continue
            for load in loads:
                for rule in ("idle", "finish"):
                    rows.append(
                        await run_once(
                            case, rule, load, args.jobs, args.scale, args.seed, Path(tmpdir)
                        )
                    )
    print(
        f"{'case':6} {'load':>4} {'rule':6} {'mean s':>7} {'p95 s':>7} {'worst/med':>9} "
        f"{'switches':>8}  jobs per GPU"
    )
    for row in rows:
        print(
            f"{row['case']:6} {row['load']:>4.0%} {row['rule']:6} {row['mean_s']:>7.2f} "
            f"{row['p95_s']:>7.2f} {row['worst_over_median']:>9.2f} {row['switches']:>8}  "
            f"{row['per_backend']}"
        )
    summary: dict[str, Any] = {}
    for case in {r["case"] for r in rows}:
        for load in loads:
            old = next(r for r in rows if (r["case"], r["load"], r["rule"]) == (case, load, "idle"))
            new = next(
                r for r in rows if (r["case"], r["load"], r["rule"]) == (case, load, "finish")
            )
            summary[f"{case}@{load:.0%}"] = {
                "mean_ratio_old_over_new": round(old["mean_s"] / new["mean_s"], 2),
                "p95_ratio_old_over_new": round(old["p95_s"] / new["p95_s"], 2),
                "switches_old": old["switches"],
                "switches_new": new["switches"],
                "worst_over_median_new": new["worst_over_median"],
            }
    print()
    for key, figures in sorted(summary.items()):
        print(
            f"{key:12} mean {figures['mean_ratio_old_over_new']:.2f}x lower, "
            f"p95 {figures['p95_ratio_old_over_new']:.2f}x lower, "
            f"switches {figures['switches_old']} -> {figures['switches_new']}"
        )
    result = {
        "benchmark": "routing",
        "scale": args.scale,
        "jobs": args.jobs,
        "summary": summary,
        "runs": [{k: v for k, v in r.items() if k != "estimates"} for r in rows],
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    asyncio.run(main())
