"""Routing by expected finish time: measured GPU speed, warm models, an aging bound."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from comfyveil import config
from comfyveil.comfy import pool, routing, workflow
from comfyveil.store import jobs
from tests.integration.test_store_eta_work import finished_run
from tests.integration.worker_support import (
    backend_configs,
    enqueue,
    running_worker,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.timeout(60)


def flux() -> workflow.Workflow:
    return workflow.find("f")


def sd3() -> workflow.Workflow:
    return workflow.find("sd3")


def bench_results(path: Path, backend: str, wf: workflow.Workflow, seconds: list[float]) -> Path:
    """A `comfyveil bench` results.json with successful runs of `wf` on `backend`."""
    record = {
        "workflow": wf.name,
        "backend": backend,
        "seed": 1,
        "ok": True,
        "error": None,
        "wall_s": 0.0,
        "upload_s": 0.0,
        "download_s": 0.0,
        "nodes": [],
        "sampler_its": None,
        "outputs": 1,
        "output_bytes": 1,
        "cached_nodes": 0,
        "prompt_id": None,
        "started_at": 0,
    }
    doc = {
        "schema_version": 1,
        "records": [{**record, "run": i, "execution_s": s} for i, s in enumerate(seconds)],
    }
    path.write_text(json.dumps(doc))
    return path


def seeded(
    tmp_path: Path, urls: list[str], seconds: dict[str, float]
) -> list[config.BackendConfig]:
    """Backend configs whose `bench` files say how long Flux Schnell takes on each."""
    configs = []
    for cfg in backend_configs(urls):
        file = bench_results(tmp_path / f"{cfg.name}.json", "measured", flux(), [seconds[cfg.name]])
        configs.append(
            config.BackendConfig(
                name=cfg.name,
                url=cfg.url,
                via="direct",
                max_waiting=cfg.max_waiting,
                bench=file,
            )
        )
    return configs


async def test_a_job_waits_for_the_fast_gpu_when_it_finishes_there_first(
    fake_comfy_factory, tmp_path: Path
) -> None:
    fakes = [await fake_comfy_factory() for _ in range(2)]
    # The seed's Flux Schnell figures: 4.92 s on the 4090, 1.80 s on the 5090.
    configs = seeded(tmp_path, [f.url for f in fakes], {"gpu0": 4.92, "gpu1": 1.80})
    async with pool.Pool(configs, probe_interval=0.2) as p:
        # 1.8 s, then 1.8 + 1.8 = 3.6 s on gpu1 both beat 4.92 s on gpu0.
        first = await p.acquire(flux(), "a")
        second = await p.acquire(flux(), "b")
        assert (first.backend.name, second.backend.name) == ("gpu1", "gpu1")
        # gpu1 is full: a third job would be done there after 5.4 s, on gpu0 after 4.92 s.
        third = await asyncio.wait_for(p.acquire(flux(), "c"), 2)
        assert third.backend.name == "gpu0"


async def test_idle_routing_takes_any_idle_gpu_whatever_its_speed(
    fake_comfy_factory, tmp_path: Path
) -> None:
    fakes = [await fake_comfy_factory() for _ in range(2)]
    configs = seeded(tmp_path, [f.url for f in fakes], {"gpu0": 4.92, "gpu1": 1.80})
    async with pool.Pool(configs, probe_interval=0.2, routing="idle") as p:
        first = await p.acquire(flux(), "a")
        second = await p.acquire(flux(), "b")
        assert {first.backend.name, second.backend.name} == {"gpu0", "gpu1"}
    async with pool.Pool(configs, probe_interval=0.2) as p:
        first = await p.acquire(flux(), "a")
        second = await p.acquire(flux(), "b")
        assert (first.backend.name, second.backend.name) == ("gpu1", "gpu1")


async def test_a_busy_fast_gpu_queues_jobs_it_finishes_first_then_they_wait_for_it(
    fake_comfy_factory, tmp_path: Path
) -> None:
    fakes = [await fake_comfy_factory() for _ in range(2)]
    configs = seeded(tmp_path, [f.url for f in fakes], {"gpu0": 30.0, "gpu1": 1.0})
    async with pool.Pool(configs, probe_interval=0.2) as p:
        # 1, 2, 3 and 4 s on gpu1 all beat 30 s on the idle gpu0: gpu1 queues them past
        # its two usual slots, up to twice as many.
        held = [await asyncio.wait_for(p.acquire(flux(), str(i)), 2) for i in range(4)]
        assert [s.backend.name for s in held] == ["gpu1"] * 4
        told: list[str] = []

        async def on_wait(text: str) -> None:
            told.append(text)

        fifth = asyncio.create_task(p.acquire(flux(), "e", on_wait=on_wait))
        await wait_for(lambda: _true(bool(told)), timeout=5)
        assert not fifth.done()  # 5 s on gpu1 still beats 30 s on gpu0: it waits
        await p.release(held[0])
        slot = await asyncio.wait_for(fifth, 2)
        assert slot.backend.name == "gpu1"


async def test_with_jobs_waiting_behind_a_job_takes_the_free_gpu_at_once(
    fake_comfy_factory, tmp_path: Path
) -> None:
    fakes = [await fake_comfy_factory() for _ in range(2)]
    configs = seeded(tmp_path, [f.url for f in fakes], {"gpu0": 3.0, "gpu1": 1.0})
    async with pool.Pool(configs, probe_interval=0.2) as p:
        held = [await p.acquire(flux(), str(i)) for i in range(2)]
        assert [s.backend.name for s in held] == ["gpu1", "gpu1"]
        # Alone, the third job would queue on gpu1 (3 s there, 3 s on gpu0: a tie goes to
        # the free GPU) -- make it clearly better to wait, then put a job behind it.
        p.estimator.learn("gpu0", flux().name, 5.0)
        p.estimator.learn("gpu0", flux().name, 5.0)
        alone = await asyncio.wait_for(p.acquire(flux(), "c"), 2)
        assert alone.backend.name == "gpu1"  # queued on the fast GPU past its slots
        await p.release(alone)
        with_others = await asyncio.wait_for(p.acquire(flux(), "d", behind=3), 2)
        assert with_others.backend.name == "gpu0"  # the idle GPU, so the queue moves


async def test_with_jobs_behind_a_job_still_avoids_a_model_switch(fake_comfy_factory) -> None:
    fakes = [await fake_comfy_factory() for _ in range(2)]
    async with pool.Pool(backend_configs([f.url for f in fakes]), probe_interval=0.2) as p:
        for name in ("gpu0", "gpu1"):
            for wf in (flux(), sd3()):
                p.estimator.learn(name, wf.name, 4.0, load=3.0)
        first = await p.acquire(flux(), "a")
        on_gpu1 = await p.acquire(sd3(), "c")
        assert (first.backend.name, on_gpu1.backend.name) == ("gpu0", "gpu1")
        await p.release(first)  # gpu0 has Flux loaded now
        on_gpu0 = [await p.acquire(flux(), "a2"), await p.acquire(flux(), "b")]
        assert [s.backend.name for s in on_gpu0] == ["gpu0", "gpu0"]
        await p.release(on_gpu1)  # gpu1 is free, with SD 3.5 loaded
        # 1 + 1 + 1 s behind gpu0's two Flux jobs beats 3 + 1 s of loading Flux on gpu1.
        slot = await asyncio.wait_for(p.acquire(flux(), "d", behind=5), 2)
        assert slot.backend.name == "gpu0" and not slot.cold


async def test_a_job_goes_where_it_finishes_first_by_the_steps_the_jobs_there_have_left(
    fake_comfy_factory,
) -> None:
    fakes = [await fake_comfy_factory() for _ in range(2)]
    async with pool.Pool(backend_configs([f.url for f in fakes]), probe_interval=0.2) as p:
        # Both GPUs: 1 s a step per megapixel, 1 s for the rest (as their progress showed).
        for name in ("gpu0", "gpu1"):
            for _ in range(3):
                p.estimator.learn(name, flux().name, 5.0, work=4.0, steps=4, step_s=1.0)
        big = {"steps": 40, "width": 1024, "height": 1024}  # 40 units of work: 41 s
        small = {"steps": 4, "width": 512, "height": 512}  # 1 unit: 2 s
        long = await p.acquire(flux(), "long", params=big)
        p.progress(long, started=True)
        p.progress(long, done=10, steps=40, step_s=1.0)  # 30 steps left: 31 s
        short = await p.acquire(flux(), "short", params=small)
        assert (long.backend.name, short.backend.name) == ("gpu0", "gpu1")
        p.progress(short, started=True)  # started after the long one, nearly done
        p.progress(short, done=3, steps=4, step_s=0.25)
        # Behind the long job's 30 steps left, a small job ends after 33 s; behind the
        # short one's last step, after 3.25 s. (Counting each job there as a typical run
        # counted down from its start took the long one, older, for the nearer done.)
        nxt = await asyncio.wait_for(p.acquire(flux(), "next", params=small), 2)
        assert nxt.backend.name == "gpu1"
        assert nxt.expected == pytest.approx(0.25 + 1.0 + 2.0, abs=0.2)


async def test_no_job_waits_longer_than_a_run_on_the_free_gpu(
    fake_comfy_factory, tmp_path: Path
) -> None:
    fakes = [await fake_comfy_factory() for _ in range(2)]
    configs = seeded(tmp_path, [f.url for f in fakes], {"gpu0": 2.0, "gpu1": 0.3})
    async with pool.Pool(configs, probe_interval=0.1) as p:
        held = [await p.acquire(flux(), str(i)) for i in range(4)]
        assert [s.backend.name for s in held] == ["gpu1"] * 4
        # gpu1 never frees: its jobs overrun their estimates. The fifth job waits for it
        # (1.5 s there, 2 s on gpu0), then takes gpu0 once waiting has cost a gpu0 run.
        started = time.monotonic()
        slot = await asyncio.wait_for(p.acquire(flux(), "e"), 10)
        waited = time.monotonic() - started
        assert slot.backend.name == "gpu0"
        assert 1.5 <= waited < 6.0


async def test_a_job_goes_to_the_gpu_that_has_its_models_loaded(fake_comfy_factory) -> None:
    fakes = [await fake_comfy_factory() for _ in range(2)]
    async with pool.Pool(backend_configs([f.url for f in fakes]), probe_interval=0.2) as p:
        for name in ("gpu0", "gpu1"):
            for wf in (flux(), sd3()):
                p.estimator.learn(name, wf.name, 4.0, load=3.0)  # loading costs 3 s
        # gpu0 last ran Flux, gpu1 SD 3.5.
        on_gpu0 = await p.acquire(flux(), "a")
        on_gpu1 = await p.acquire(sd3(), "b")
        assert (on_gpu0.backend.name, on_gpu1.backend.name) == ("gpu0", "gpu1")
        await p.release(on_gpu0)
        await p.release(on_gpu1)
        assert p.get("gpu0").models_after == routing.models(flux())
        assert p.get("gpu1").models_after == routing.models(sd3())
        for _ in range(3):
            on_sd3 = await p.acquire(sd3(), "c")
            assert on_sd3.backend.name == "gpu1" and not on_sd3.cold
            await p.release(on_sd3)
            on_flux = await p.acquire(flux(), "d")
            assert on_flux.backend.name == "gpu0" and not on_flux.cold
            await p.release(on_flux)


async def test_the_worker_learns_run_times_and_cold_starts_from_comfyui(
    db, fake_comfy_factory
) -> None:
    fake = await fake_comfy_factory(delays={"UNETLoader": 0.3})
    async with running_worker(db, [fake.url]) as w:
        done = []
        for prompt in ("a red fox", "a blue fox", "a green fox"):
            job = await enqueue(db, prompt=prompt)
            done.append(await wait_status(db, job.id, jobs.Status.SUCCEEDED))
        (estimate,) = w.pool.estimator.estimates("gpu0")
    # The first run loaded the model (0.3 s); the next two found it in ComfyUI's cache.
    assert estimate.samples == 3
    # A warm run leaves the load out: measured against the cold run as the database saw
    # it, since a loaded machine adds to every run (it once made a warm run 0.29 s).
    assert done[0].executing_at is not None and done[0].finished_at is not None
    cold_run = (done[0].finished_at - done[0].executing_at).total_seconds()
    assert estimate.run is not None and estimate.run < cold_run - 0.15
    # (0.3 s over the warm runs, less whatever a loaded machine adds to those: at least
    # half of it, where a worker that did not learn cold starts would say nothing.)
    assert estimate.cold_extra is not None and 0.15 <= estimate.cold_extra < 2.0


async def test_the_runs_kept_say_which_loaded_models_and_the_eta_leaves_the_load_out(
    db, fake_comfy_factory
) -> None:
    # The ETA every front end shows learns from the runs the database keeps: a GPU's
    # first run, which loaded the models, must not read as a slow warm run there.
    fake = await fake_comfy_factory(delays={"UNETLoader": 0.3})
    async with running_worker(db, [fake.url]):
        first = await enqueue(db, prompt="a red fox")
        ran = await wait_status(db, first.id, jobs.Status.SUCCEEDED)
    # The worker times a node by when ComfyUI's messages reach it (the real server sends
    # no per-node timestamps), so a busy machine can read the 0.3 s load a little short.
    assert ran.progress["cold"] is True and 0.2 <= ran.progress["load_s"] < 2.0
    next_one = await enqueue(db, prompt="a blue fox")
    wait = await db.jobs.wait(next_one.id, backends=["gpu0"])
    assert ran.executing_at is not None and ran.finished_at is not None
    run_s = (ran.finished_at - ran.executing_at).total_seconds()
    # The model stays loaded on gpu0: the next run costs the first one less its load.
    assert wait.seconds is not None
    assert wait.seconds == pytest.approx(run_s - ran.progress["load_s"], abs=0.05)
    async with running_worker(db, [fake.url]):
        warm = await wait_status(db, next_one.id, jobs.Status.SUCCEEDED)
    assert warm.progress["cold"] is False and warm.progress["load_s"] is None


def test_a_bench_file_that_is_not_results_json_is_refused_naming_the_backend(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "results.json"
    bad.write_text('{"hello": 1}')
    cfg = config.BackendConfig(name="gpu0", url="http://127.0.0.1:1", via="direct", bench=bad)
    p = pool.Pool([cfg])
    with pytest.raises(config.ConfigError, match=r"backend gpu0: bench: .*not a comfyveil bench"):
        p.seed_estimates()


def test_ran_cold_reads_the_loaders_from_the_cached_nodes() -> None:
    wf = flux()
    loaders = wf.loader_nodes()
    assert loaders  # the Flux graph loads a UNet, text encoders and a VAE
    assert routing.ran_cold(wf, [])
    assert not routing.ran_cold(wf, sorted(loaders))
    assert routing.ran_cold(wf, sorted(loaders)[1:])


async def _true(value: bool) -> bool:
    return value


def test_a_bench_run_answered_from_the_cache_teaches_nothing(tmp_path: Path) -> None:
    """A results.json from a bench that still averaged cache hits (every node cached, none
    executed, milliseconds) must not teach the router that a run takes 1 ms."""
    file = bench_results(tmp_path / "old.json", "gpu0", flux(), [4.0, 0.001])
    doc = json.loads(file.read_text())
    doc["records"][1].update(cached_nodes=7, nodes=[])
    doc["records"][0].update(nodes=[{"node": "13", "class_type": "KSampler", "seconds": 3.9}])
    file.write_text(json.dumps(doc))
    estimator = routing.Estimator()
    assert estimator.seed_from_bench(file) == 1
    assert estimator.run_seconds("gpu0", flux().name) == 4.0



async def test_a_job_runs_on_the_gpu_its_eta_announced(db, fake_comfy_factory) -> None:
    # The database has seen Flux take 4 s on gpu0 and 1 s on gpu1. A worker started
    # since has learnt nothing yet, and by its own rule would take gpu0 (both unknown,
    # gpu0 first); the ETA the user was shown said gpu1.
    runs = (("gpu0", 4.0, 60.0), ("gpu0", 4.0, 50.0), ("gpu1", 1.0, 40.0), ("gpu1", 1.0, 30.0))
    for backend, seconds, ago in runs:
        await finished_run(db, 1, 2, 256, waited=0.0, ran=seconds, ago=ago, backend=backend)
    job = await enqueue(db, prompt="a blue fox")
    wait = await db.jobs.wait(job.id, backends=["gpu0", "gpu1"])
    assert wait is not None and wait.backend == "gpu1"
    queued = await db.jobs.get(job.id)
    assert queued is not None and queued.plan == "gpu1"  # kept with the job
    fakes = [await fake_comfy_factory() for _ in range(2)]
    async with running_worker(db, [f.url for f in fakes]) as w:
        assert not w.pool.estimator.estimates()  # this worker knows no run
        ran = await wait_status(db, job.id, jobs.Status.SUCCEEDED)
    assert ran.backend == "gpu1"
    assert [sum(f.executions.values()) for f in fakes] == [0, 1]
