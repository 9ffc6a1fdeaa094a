"""How right the ETA users see is, first and at every refresh, and how much it jumps.

    .venv/bin/python benchmarks/eta_accuracy.py [--jobs 120] [--scale 0.25]

Four equal fake backends, three workflows (Flux Schnell, Flux Dev, SD 3.5) whose model
loads cost 3 s (as benchmarks/routing.py's mixed case), and jobs that ask for different
work: 1x to 8x the sampler steps (Flux Schnell 1-8, the others 2-16) at 512x512 to
1024x1024. The fake ComfyUI's run time grows as a real one's does: each sampler step
costs time per megapixel, the decoder a fixed part. Poisson arrivals (seeded) at 30 % and
80 % of the pool's capacity, dispatched in arrival order through the real pool (routing
"finish"), the fakes real HTTP and WebSocket on 127.0.0.1, served by a process of their
own (`tests/fakes/apart.py`): in this one's event loop their runs stretched with its
CPU, which a GPU's do not (`--fakes-here` for the old way). The database is left out:
the queue state each ETA needs is kept here as the store holds it (the jobs queued;
those claimed, waiting for a GPU; those on a backend, since ComfyUI started them, with
their progress: steps done and a step's seconds, as the worker records them; the
finished runs, from ComfyUI's start to result, with whether each loaded models and the
seconds its loaders took, as the worker keeps them).

ETAs compared, each from the same state at the same moment:

- new: `store.eta.estimate` (cost per unit of work per backend and command, running
  jobs by their progress, the jobs ahead played by the pool's rule, the mean over
  likely playbacks with each run a little longer or shorter);
- single: the same from one playback (the estimate as it stands, no likely orders);
- blind: the same estimator told nothing of the work asked nor of progress (every job
  one unit), one playback: the ETA before it learnt sizes;
- old: the chat's ETA before the routing estimator (mean of the command's last 20 runs,
  the queue ahead shared over the GPUs).

Reported per load, as a share of the mean wait really left (unscaled seconds):

- first: the mean absolute error of the ETA shown when a job is queued, against its real
  wait from then to its result (target for new: under 25 %);
- later: every ETA shown after that, every 0.25 s (unscaled 1 s) for every job not done
  (queued, waiting on a GPU, running), against the wait really left at that moment
  (target: under 25 %);
- jumps: the largest change of one job's ETA between two refreshes (the earlier one
  counted down by the time between them), and how many jobs saw one over 20 % (target:
  none; no GPU goes down here), counted from 5 s left (at 2 s left one second more or
  less is half of it), and also from 1 s left; and among the jobs queued once the cost
  model had learnt 30 runs ("warm": a deployment keeps its runs in its database, so only
  its first jobs meet a cost model that knows nothing).

Each load runs twice on the same arrivals (`--plans kept,rule`): "kept", each job's first
ETA writes where it placed the job and the pool keeps it there unless the runs strayed
far (`routing.keep_plan`, as the store and the worker do); "rule", the pool's rule alone
(the code before). The targets are judged on "kept"; "rule" is the baseline.

New and single are computed after the run from the snapshots taken at each refresh (their
playbacks would take the CPU from the run they measure). New is reported as shown
(through `EtaMemory`) and raw (as the estimator said it): the
shown one must not meet the targets by hiding a wrong estimate.

Each raw jump is taken apart (`explain`): the later refresh's parts are swapped into the
earlier one's state one at a time (the cost model refit, the progress of jobs running at
both, the jobs that finished, the jobs ahead that went to a GPU, the models loaded, the
queue, our own job's state), and the jump is put down to the part that moved it most.
Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.fakes

from tests.fakes.apart import fakes_apart  # noqa: E402
from tests.fakes.comfyui import FakeComfyUI  # noqa: E402

from comfyveil import config  # noqa: E402
from comfyveil.comfy import events, execute, pool, routing, workflow  # noqa: E402
from comfyveil.store import eta  # noqa: E402

TARGET_MAE = 0.25
JUMP = 0.20  # an ETA may not change by more than this share between two refreshes
LEAST_S = 5.0  # unscaled seconds left from which a jump counts against the target
WARM_RUNS = 30  # runs the cost model has learnt before a job counts as "warm"
SAMPLE_S = 1.0  # unscaled seconds between refreshes of the ETAs shown
OLD_RUNS = 20  # the old ETA's mean: the last 20 runs of a command
KINDS = ("shown", "raw", "single", "blind", "old")
BACKENDS = 4
COMMANDS = ("f", "fd", "sd3")
LOADERS = ("UNETLoader", "CheckpointLoaderSimple")
LOAD_S = 3.0  # unscaled: a model switch
BASE_STEPS = {"f": 1, "fd": 2, "sd3": 2}  # 1x (Flux Schnell takes 8 at most); 1x to 8x
SIZES = ((512, 512), (768, 768), (1024, 576), (1024, 1024))
STEP_S_PER_MP = 0.2  # unscaled seconds a sampler step takes per megapixel
DECODE_S = 0.25  # unscaled: the decoder, whatever the size


@dataclass(frozen=True)
class Ask:
    command: str
    steps: int
    width: int
    height: int

    @property
    def params(self) -> dict[str, object]:
        return {"steps": self.steps, "width": self.width, "height": self.height}

    @property
    def work(self) -> float:
        return eta.work_of(self.params)

    def run_s(self) -> float:
        """Unscaled seconds of a warm run on the fake."""
        return DECODE_S + self.steps * STEP_S_PER_MP * self.width * self.height / eta.MEGAPIXEL


@dataclass
class OnGpu:
    backend: str
    started: float | None = None  # when ComfyUI started it
    done: float | None = None  # steps done
    steps: int | None = None
    first_tick: tuple[float, float] | None = None  # (value, time) of the first step seen
    step_s: float | None = None


@dataclass
class State:
    """The queue as the store holds it; times in unscaled seconds since the start."""

    queued: deque[int] = field(default_factory=deque)  # in claim order
    claimed: dict[int, float] = field(default_factory=dict)  # waiting for a GPU: since
    on_gpu: dict[int, OnGpu] = field(default_factory=dict)
    # finished: (backend, command, started, finished, work, steps, step_s, cold, load)
    spans: list[
        tuple[str, str, float, float, float, int, float | None, bool | None, float | None]
    ] = field(default_factory=list)


def old_eta(state: State, asks: list[Ask], index: int, parallel: int) -> float | None:
    by_cmd: dict[str, list[float]] = defaultdict(list)
    for _b, command, begin, end, *_ in state.spans:
        by_cmd[command].append(end - begin)

    def mean(values: list[float]) -> float | None:
        return statistics.fmean(values[-OLD_RUNS:]) if values else None

    own = mean(by_cmd[asks[index].command])
    if own is None:
        return None
    queue = list(state.queued)
    ahead = queue[: queue.index(index)] if index in queue else []
    waiting = sum(mean(by_cmd[asks[i].command]) or own for i in ahead)
    return waiting / parallel + own


class Estimates:
    """The new and the work-blind estimator, taught the runs finished so far."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._learnt = -1
        self.new = eta.Model()
        self.blind = eta.Model()

    def refresh(self) -> None:
        if self._learnt == len(self.state.spans):
            return
        self._learnt = len(self.state.spans)
        spans = self.state.spans
        self.new = eta.estimator_from(eta.runs_from(spans))
        self.blind = eta.estimator_from(eta.runs_from([s[:4] for s in spans]))


@dataclass
class Snapshot:
    """What one ETA was computed from: the jobs on the GPUs and ahead, by job, so that
    a jump between two refreshes can be taken apart (`explain`)."""

    at: float
    model: eta.Model
    busy: dict[int, eta.Busy]
    ahead: dict[int, eta.Ahead]  # in claim order
    last: dict[str, str]
    own: dict[str, Any]
    placed: dict[int, str] = field(default_factory=dict)  # where the guess put each ahead

    def seconds(self, spread: dict[str, float] | None = None, **swap: Any) -> float | None:
        return self.wait(spread, **swap).seconds

    def wait(self, spread: dict[str, float] | None = None, **swap: Any) -> eta.Wait:
        parts = {
            "model": self.model,
            "busy": self.busy,
            "ahead": self.ahead,
            "last": self.last,
            "own": self.own,
            **swap,
        }
        return eta.estimate(
            parts["model"],
            backends=self.own["names"],
            busy=list(parts["busy"].values()),
            ahead=list(parts["ahead"].values()),
            last_command=parts["last"],
            spread=spread,
            **{k: v for k, v in parts["own"].items() if k != "names"},
        )


def snapshot(
    state: State,
    asks: list[Ask],
    index: int,
    now: float,
    names: list[str],
    *,
    model: eta.Model,
    blind: bool,
    plans: dict[int, str] | None = None,
) -> Snapshot:
    plans = plans or {}

    def work(i: int) -> float:
        return 1.0 if blind else asks[i].work

    last: dict[str, str] = {}
    for backend, command, *_ in sorted(state.spans, key=lambda s: s[3]):
        last[backend] = command
    busy: dict[int, eta.Busy] = {}
    mine = state.on_gpu.get(index)
    passed = False  # jobs sent after ours to its GPU wait behind it there: left out, as
    # the store leaves out those claimed after it
    for i, gpu in state.on_gpu.items():
        if i == index:
            passed = True
            continue
        if passed and mine is not None and gpu.backend == mine.backend:
            continue
        running = gpu.started is not None
        busy[i] = eta.Busy(
            gpu.backend,
            asks[i].command,
            now - gpu.started if running else None,  # type: ignore[operator]
            work(i),
            None if blind else asks[i].steps,
            None if blind or not running else gpu.done,
            None if blind or not running else gpu.step_s,
        )
    queue = list(state.queued)
    if index in queue:
        ahead = list(state.claimed) + queue[: queue.index(index)]
    else:  # claimed, waiting for a GPU
        ahead = [i for i in state.claimed if i < index]
    started = mine is not None and mine.started is not None
    own = {
        "names": names,
        # the jobs waiting behind ours, as the pool's rule weighs them when it is sent
        "behind": len(queue) - queue.index(index) - 1 if index in queue else len(queue),
        "command": asks[index].command,
        "on": mine.backend if mine is not None else None,
        "elapsed": now - mine.started if started else None,  # type: ignore[operator, union-attr]
        "work": work(index),
        "steps": None if blind else asks[index].steps,
        "done": None if blind or not started else mine.done,  # type: ignore[union-attr]
        "step_s": None if blind or not started else mine.step_s,  # type: ignore[union-attr]
        "plan": plans.get(index),
    }
    return Snapshot(
        now,
        model,
        busy,
        {}
        if mine is not None
        else {
            i: eta.Ahead(asks[i].command, None, work(i), key=str(i), plan=plans.get(i))
            for i in ahead
        },
        last,
        own,
    )


def estimate(
    state: State,
    asks: list[Ask],
    index: int,
    now: float,
    names: list[str],
    *,
    model: eta.Model,
    blind: bool,
    spread: dict[str, float] | None = None,
) -> float | None:
    snap = snapshot(state, asks, index, now, names, model=model, blind=blind)
    return snap.seconds(spread)


@contextlib.asynccontextmanager
async def fake_gpus(specs: list[dict[str, Any]], *, apart: bool) -> AsyncIterator[list[str]]:
    """The fakes' URLs: served by a process of their own (`apart`), or by this one."""
    if apart:
        async with fakes_apart(specs) as urls:
            yield urls
        return
    fakes = [FakeComfyUI(**{**spec, "root": Path(spec["root"])}) for spec in specs]
    for fake in fakes:
        await fake.start()
    try:
        yield [fake.url for fake in fakes]
    finally:
        for fake in fakes:
            await fake.stop()


async def run_once(
    load: float,
    jobs: int,
    scale: float,
    seed: int,
    tmp: Path,
    *,
    plans_kept: bool = True,
    fakes_here: bool = False,
) -> dict[str, Any]:
    delays = {"VAEDecode": DECODE_S * scale}
    for loader in LOADERS:
        delays[loader] = LOAD_S * scale
    specs = [
        {"step_cost": STEP_S_PER_MP * scale, "delays": dict(delays),
         "root": str(tmp / f"eta-{load}-{plans_kept}-{i}")}
        for i in range(BACKENDS)
    ]  # fmt: skip
    async with fake_gpus(specs, apart=not fakes_here) as urls:
        row = await _run_on(urls, load, jobs, scale, seed, plans_kept=plans_kept)
    return {**row, "fakes": "here" if fakes_here else "apart"}


async def _run_on(
    urls: list[str], load: float, jobs: int, scale: float, seed: int, *, plans_kept: bool
) -> dict[str, Any]:
    configs = [
        config.BackendConfig(name=f"gpu{i}", url=url, via="direct", max_waiting=1)
        for i, url in enumerate(urls)
    ]
    names = [c.name for c in configs]
    rng = random.Random(seed)
    asks = [
        Ask(command, BASE_STEPS[command] * rng.randint(1, 8), *rng.choice(SIZES))
        for command in (rng.choice(COMMANDS) for _ in range(jobs))
    ]
    mean_run = statistics.fmean(a.run_s() for a in asks)
    rate = load * BACKENDS / mean_run / scale  # arrivals a second, scaled time
    arrivals: list[float] = []
    at = 0.0
    for _ in range(jobs):
        at += rng.expovariate(rate)
        arrivals.append(at)
    flows = {c: workflow.find(c) for c in COMMANDS}
    state = State()
    models = Estimates(state)
    memory = eta.EtaMemory()
    ids = [uuid.uuid4() for _ in range(jobs)]
    # The backend each job's first ETA announced, which the pool keeps it to (as the
    # store keeps it with the job); none when plans are off (the rule alone, as before).
    plans: dict[int, str] = {}
    announced: dict[int, str] = {}  # where each job's first ETA placed it, in either mode
    # per job: (when, ETA) for each kind: shown (new through EtaMemory), raw, single,
    # blind, old
    looks: dict[str, dict[int, list[tuple[float, float]]]] = {k: defaultdict(list) for k in KINDS}
    snaps: dict[int, list[Snapshot]] = defaultdict(list)  # the raw ETA's, as `looks`
    done: dict[int, float] = {}
    placed_on: dict[int, str] = {}
    learnt: dict[int, int] = {}  # runs the cost model had learnt when each job was queued
    queue: asyncio.Queue[int] = asyncio.Queue()
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()

    def now() -> float:
        return (time.monotonic() - start) / scale

    def look(index: int, at: float) -> None:
        # The new ETA is computed from the snapshot after the run (`replay`): its many
        # playbacks would take the CPU from the run they are measured on.
        models.refresh()
        snap = snapshot(state, asks, index, at, names, model=models.new, blind=False, plans=plans)
        if index not in announced and index in state.queued:
            # The first ETA's placement, as the store keeps it with the job (one playback:
            # the one every other playback of this job keeps it to).
            backend = snap.wait({}).backend
            if backend is not None:
                announced[index] = backend
                if plans_kept:
                    plans[index] = backend
                    snap.own["plan"] = backend
        snaps[index].append(snap)
        blind = estimate(state, asks, index, at, names, model=models.blind, blind=True, spread={})
        old = old_eta(state, asks, index, len(names))
        if blind is not None:
            looks["blind"][index].append((at, blind))
        if old is not None:
            looks["old"][index].append((at, old))

    async with pool.Pool(configs, probe_interval=0.5, routing="finish") as p:
        start = time.monotonic()

        async def run_job(index: int, slot: pool.Slot) -> None:
            ask = asks[index]
            wf = flows[ask.command]
            gpu = state.on_gpu[index]
            released = False

            async def release() -> None:
                nonlocal released
                if not released:
                    released = True
                    await p.release(slot)

            async def on_event(event: events.Event) -> None:
                # What the worker records: ComfyUI's start, the steps done and the
                # pace of the sampler's steps so far.
                # The pool is told the same, as the worker tells it.
                if isinstance(event, events.ExecutionStart):
                    gpu.started = now()
                    p.progress(slot, started=True)
                elif isinstance(event, events.Progress) and event.max > 1:
                    at = now()
                    gpu.done, gpu.steps = float(event.value), int(event.max)
                    if gpu.first_tick is None or event.value <= gpu.first_tick[0]:
                        gpu.first_tick = (float(event.value), at)
                    else:
                        first, then = gpu.first_tick
                        gpu.step_s = (at - then) / (event.value - first)
                    # the pool's clock is not scaled: a step's seconds as they pass
                    pace = gpu.step_s * scale if gpu.step_s is not None else None
                    p.progress(slot, done=gpu.done, steps=gpu.steps, step_s=pace)

            values = dict(
                wf.validate({"prompt": f"eta bench {index}", "seed": index, **ask.params})
            )
            try:
                outcome = await execute.execute(
                    slot.backend.client,
                    wf,
                    values,
                    prompt_id=slot.job_id,
                    on_event=on_event,
                    on_ran=release,
                )
            finally:
                await release()
            p.learn(slot, outcome.result.timings)
            del state.on_gpu[index]
            done[index] = now()
            began = gpu.started if gpu.started is not None else done[index]
            # as the worker keeps it with the job: models loaded or not, their seconds
            ran = routing.measured(slot.workflow, outcome.result.timings)
            load = ran.get("load_s")
            state.spans.append(
                (gpu.backend, ask.command, began, done[index], ask.work, ask.steps,
                 gpu.step_s, ran.get("cold"), None if load is None else load / scale)
            )  # fmt: skip

        async def dispatch() -> None:
            for _ in range(jobs):
                index = await queue.get()
                state.queued.remove(index)
                state.claimed[index] = now()
                slot = await p.acquire(
                    flows[asks[index].command],
                    str(uuid.uuid4()),
                    behind=queue.qsize(),
                    params=asks[index].params,
                    planned=plans.get(index),
                )
                del state.claimed[index]
                state.on_gpu[index] = OnGpu(slot.backend.name)
                placed_on[index] = slot.backend.name
                task = asyncio.create_task(run_job(index, slot))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        async def watch() -> None:
            while True:
                await asyncio.sleep(SAMPLE_S * scale)
                at = now()
                for index in [*state.on_gpu, *state.claimed, *state.queued]:
                    look(index, at)

        dispatcher = asyncio.create_task(dispatch())
        watcher = asyncio.create_task(watch())
        for index, due in enumerate(arrivals):
            await asyncio.sleep(max(0.0, start + due - time.monotonic()))
            state.queued.append(index)
            learnt[index] = len(state.spans)
            look(index, now())
            queue.put_nowait(index)
        await dispatcher
        while tasks:
            await asyncio.gather(*tasks)
        watcher.cancel()

    for index, seen in snaps.items():
        for snap in seen:
            raw, single = snap.seconds(), snap.seconds({})
            if single is not None:
                looks["single"][index].append((snap.at, single))
            if raw is not None:
                looks["raw"][index].append((snap.at, raw))
                shown = memory.seconds(ids[index], raw, snap.at)
                looks["shown"][index].append((snap.at, shown if shown is not None else raw))

    def first_mae(kind: str, among: list[int]) -> float:
        errors = [abs(looks[kind][i][0][1] - (done[i] - looks[kind][i][0][0])) for i in among]
        return statistics.fmean(errors) / statistics.fmean(
            done[i] - looks[kind][i][0][0] for i in among
        )

    def later_mae(kind: str) -> float:
        errors, left = [], []
        for i, seen in looks[kind].items():
            for at, seconds in seen[1:]:
                errors.append(abs(seconds - (done[i] - at)))
                left.append(done[i] - at)
        return statistics.fmean(errors) / statistics.fmean(left)

    def jumps(kind: str, least: float, among: set[int] | None = None) -> tuple[int, float]:
        """Jobs whose ETA changed by more than JUMP between two refreshes, and the
        largest change; the earlier one is first counted down by the time between, and
        only changes from `least` seconds or more left are counted (at 2 s left, 1 s
        more or less is half of it); only the jobs `among`, when given."""
        jumped, worst = 0, 0.0
        for index, seen in looks[kind].items():
            if among is not None and index not in among:
                continue
            steps = [
                abs(b / (a - (t2 - t1)) - 1.0)
                for (t1, a), (t2, b) in itertools.pairwise(seen)
                if a - (t2 - t1) >= least
            ]
            jumped += any(step > JUMP + 1e-9 for step in steps)
            worst = max([worst, *steps])
        return jumped, worst

    # Jobs every kind had a first ETA for (the first few have nothing measured yet).
    both = [i for i in range(jobs) if all(looks[k].get(i) for k in looks)]
    row: dict[str, Any] = {
        "load": load,
        "plans_kept": plans_kept,
        # jobs that ran on the GPU their first ETA named (the chat says "on gpu1")
        "ran_where_announced": sum(
            1 for i, b in announced.items() if i in placed_on and placed_on[i] == b
        ),
        "announced": len(announced),
        "jobs": jobs,
        "with_eta": len(both),
        "mean_wait_s": round(statistics.fmean(done[i] - arrivals[i] / scale for i in both), 2),
    }
    # Queued once the cost model had learnt WARM_RUNS runs: a deployment's database
    # keeps its runs, so only its first jobs meet a model that knows nothing yet.
    warm = {i for i in both if learnt[i] >= WARM_RUNS}
    row["with_eta_warm"] = len(warm)
    for kind in KINDS:
        jumped, worst = jumps(kind, LEAST_S)
        jumped_1s, worst_1s = jumps(kind, 1.0)
        jumped_warm, _ = jumps(kind, LEAST_S, warm)
        row[kind] = {
            "first_mae": round(first_mae(kind, both), 3),
            "later_mae": round(later_mae(kind), 3),
            "jobs_jumped_over_20pct": jumped,
            "largest_jump": round(worst, 2),
            "jobs_jumped_over_20pct_from_1s": jumped_1s,
            "warm_jobs_jumped_over_20pct": jumped_warm,
            "largest_jump_from_1s": round(worst_1s, 2),
        }
    row["raw_jumps_by_cause"] = explain_all(snaps, done)
    return row


TERMS = (
    "refit",  # the cost model learnt a run that finished
    "progress",  # jobs running at both refreshes (ours included): their pace, vs counting down
    "finished",  # a job on a GPU finished
    "started",  # a job ahead went to a GPU (left the queue for a backend)
    "loaded",  # the models a backend holds changed
    "queue",  # the jobs ahead changed otherwise (new, reordered)
    "own",  # ours changed state (queued, claimed, waiting on a GPU, running)
)


def explain(a: Snapshot, b: Snapshot) -> dict[str, float]:
    """How much each term moved the ETA from refresh `a` to refresh `b`, in seconds
    against `a` counted down: swap `a`'s parts for `b`'s one at a time."""
    dt = b.at - a.at
    parts: dict[str, Any] = {}
    before = a.seconds() or 0.0
    moved: dict[str, float] = {}

    def step(term: str, **swap: Any) -> None:
        nonlocal before
        parts.update(swap)
        after = a.seconds(**parts) or 0.0
        moved[term] = after - before
        before = after

    step("refit", model=b.model)
    same_own = a.own["on"] == b.own["on"] and (a.own["elapsed"] is None) == (
        b.own["elapsed"] is None
    )
    step(
        "progress",
        busy={i: b.busy.get(i, job) for i, job in a.busy.items()},
        own=b.own if same_own else a.own,
    )
    moved["progress"] += dt
    step("finished", busy={i: b.busy[i] for i in a.busy if i in b.busy})
    started = {i: job for i, job in b.busy.items() if i not in a.busy}
    step(
        "started",
        busy={**parts["busy"], **started},
        ahead={i: job for i, job in a.ahead.items() if i not in started},
    )
    step("loaded", last=b.last)
    step("queue", ahead=b.ahead)
    step("own", own=b.own)
    return moved


def explain_all(snaps: dict[int, list[Snapshot]], done: dict[int, float]) -> dict[str, Any]:
    """For every raw jump over JUMP (from LEAST_S left), the term that moved it most; and
    how much each term moved the ETA at those refreshes, as a share of the ETA then."""
    causes = dict.fromkeys(TERMS, 0)
    weight = dict.fromkeys(TERMS, 0.0)
    worst: list[tuple[float, int, str, dict[str, float], list[str]]] = []
    jobs: set[int] = set()
    not_finished: set[int] = set()  # jobs with a jump not led by a job that finished
    moments: Counter[float] = Counter()  # refreshes with jumps
    for index, seen in snaps.items():
        for a, b in itertools.pairwise(seen):
            left = (a.seconds() or 0.0) - (b.at - a.at)
            if left < LEAST_S:
                continue
            change = (b.seconds() or 0.0) / left - 1.0
            if abs(change) <= JUMP + 1e-9:
                continue
            moved = explain(a, b)
            term = max(moved, key=lambda t: abs(moved[t]))
            causes[term] += 1
            moments[round(b.at, 1)] += 1
            jobs.add(index)
            if term != "finished":
                not_finished.add(index)
            for t, v in moved.items():
                weight[t] += abs(v) / left
            # the jobs ahead that went to a GPU in between: planned there, or not
            went = [
                f"{i}:{a.ahead[i].plan or '-'}>{b.busy[i].backend}"
                for i in b.busy
                if i not in a.busy and i in a.ahead
            ]
            worst.append((change, index, term, moved, went))
    worst.sort(key=lambda w: -abs(w[0]))
    return {
        "jumps": sum(causes.values()),
        "jobs": len(jobs),
        "jobs_but_finished": len(not_finished),
        # the refreshes they came at: one moment often moves every queued job's ETA
        "moments": len(moments),
        "largest_moments": [{"at_s": t, "jumps": n} for t, n in moments.most_common(3)],
        "by_largest_term": causes,
        "share_moved": {t: round(v / max(1, sum(causes.values())), 3) for t, v in weight.items()},
        "worst": [
            {
                "job": i,
                "change": round(c, 2),
                "term": t,
                **{k: round(v, 2) for k, v in m.items()},
                "went": went,
            }
            for c, i, t, m, went in worst[:8]
        ],
    }


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=120)
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--loads", default="0.3,0.8", help="fractions of the pool's capacity")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--plans",
        default="kept,rule",
        help="kept: each job keeps the backend its first ETA announced; rule: the pool's "
        "rule alone (the baseline); both: each load run twice, the same arrivals",
    )
    parser.add_argument(
        "--fakes-here",
        action="store_true",
        help="serve the fake GPUs from this process's event loop (as before 2026-12-07): "
        "their runs then stretch with the benchmark's own CPU",
    )
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory(prefix="comfyveil-eta-") as tmpdir:
        for load in (float(x) for x in args.loads.split(",")):
            for mode in args.plans.split(","):
                rows.append(
                    await run_once(
                        load,
                        args.jobs,
                        args.scale,
                        args.seed,
                        Path(tmpdir),
                        plans_kept=mode == "kept",
                        fakes_here=args.fakes_here,
                    )
                )
    print(
        f"{'load':>4} {'plans':>5} {'ETA':>6} {'jobs':>5} {'w/ ETA':>6} {'wait s':>7} {'first':>6} "
        f"{'later':>6} {'jumped':>6} {'largest':>7} {'jumped≥1s':>9} {'largest':>7} "
        f"{'warm jumped':>11}"
    )
    for r in rows:
        for kind in KINDS:
            k = r[kind]
            print(
                f"{r['load']:>4.0%} {'kept' if r['plans_kept'] else 'rule':>5} {kind:>6} "
                f"{r['jobs']:>5} {r['with_eta']:>6} "
                f"{r['mean_wait_s']:>7.2f} {k['first_mae']:>6.0%} {k['later_mae']:>6.0%} "
                f"{k['jobs_jumped_over_20pct']:>6} {k['largest_jump']:>7.0%} "
                f"{k['jobs_jumped_over_20pct_from_1s']:>9} {k['largest_jump_from_1s']:>7.0%} "
                f"{k['warm_jobs_jumped_over_20pct']:>4} of {r['with_eta_warm']:<4}"
            )
    for r in rows:
        why = r["raw_jumps_by_cause"]
        print(
            f"{r['load']:.0%}, plans {'kept' if r['plans_kept'] else 'rule'}: "
            f"{r['ran_where_announced']} of {r['announced']} jobs ran where announced; "
            f"raw jumps over {JUMP:.0%} (from {LEAST_S:.0f} s): {why['jumps']} "
            f"in {why['jobs']} jobs, at {why['moments']} moments (the largest: "
            + ", ".join(f"{m['jumps']} at {m['at_s']:.1f} s" for m in why["largest_moments"])
            + f"); jobs with one not led by a job that finished: {why['jobs_but_finished']}"
        )
        print(
            "  by the term that moved most: "
            + ", ".join(f"{t} {n}" for t, n in why["by_largest_term"].items() if n)
        )
        print(
            "  mean move per term, share of the ETA: "
            + ", ".join(f"{t} {v:.0%}" for t, v in why["share_moved"].items())
        )
        for w in why["worst"]:
            print("   ", w)
    met = all(
        r[kind]["first_mae"] < TARGET_MAE
        and r[kind]["later_mae"] < TARGET_MAE
        and r[kind]["jobs_jumped_over_20pct"] == 0
        for r in rows
        if r["plans_kept"]
        for kind in ("shown", "raw")
    )
    print(
        "first/later: mean absolute error of the first ETA and of every later one, share "
        "of the wait really left; jumped: jobs whose ETA changed by more than 20 % between "
        f"two refreshes with {LEAST_S:.0f} s or more left (jumped≥1s: from 1 s left; warm "
        f"jumped: among the jobs queued once the cost model had learnt {WARM_RUNS} runs), and "
        f"the largest change. Target for new (shown and raw): first and later < "
        f"{TARGET_MAE:.0%}, no jump over 20 %: {'met' if met else 'NOT met'}"
    )
    return {"benchmark": "eta_accuracy", "rows": rows, "target_mae": TARGET_MAE, "met": met}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
