"""The backend pool against fake ComfyUI servers: slots, preferences, health, capabilities."""

from __future__ import annotations

import asyncio

import pytest

from comfyveil.comfy import health, pool, workflow
from tests.integration.worker_support import backend_configs, wait_for

pytestmark = pytest.mark.timeout(60)


def flux() -> workflow.Workflow:
    return workflow.find("f")


async def _true(value: bool) -> bool:
    return value


async def test_one_running_plus_max_waiting_per_backend_and_idle_ones_first(
    fake_comfy_factory,
) -> None:
    fakes = [await fake_comfy_factory() for _ in range(2)]
    async with pool.Pool(backend_configs([f.url for f in fakes]), probe_interval=0.2) as p:
        wf = flux()
        first = await p.acquire(wf, "a")
        second = await p.acquire(wf, "b")
        assert {first.backend.name, second.backend.name} == {"gpu0", "gpu1"}  # idle first
        third = await p.acquire(wf, "c")
        fourth = await p.acquire(wf, "d")
        assert p.free_backends() == []
        fifth = asyncio.create_task(p.acquire(wf, "e"))
        await asyncio.sleep(0.3)
        assert not fifth.done()  # two per backend: one running, one waiting
        await p.release(third)
        slot = await asyncio.wait_for(fifth, 2)
        assert slot.backend is third.backend
        for held in (first, second, fourth, slot):
            await p.release(held)
        assert sorted(p.free_backends()) == ["gpu0", "gpu1"]


async def test_backend_without_the_model_is_never_a_candidate(fake_comfy_factory) -> None:
    empty = await fake_comfy_factory(models={"checkpoints": [], "diffusion_models": [],
                                             "text_encoders": [], "vae": []})
    full = await fake_comfy_factory()
    async with pool.Pool(backend_configs([empty.url, full.url])) as p:
        assert [b.name for b in p.candidates(flux())] == ["gpu1"]
        assert p.why_not(flux()) is None
        for _ in range(3):
            slot = await p.acquire(flux(), "x")
            assert slot.backend.name == "gpu1"
            await p.release(slot)


async def test_no_backend_with_the_model_fails_at_once(fake_comfy_factory) -> None:
    empty = await fake_comfy_factory(models={"checkpoints": [], "diffusion_models": [],
                                             "text_encoders": [], "vae": []})
    async with pool.Pool(backend_configs([empty.url])) as p:
        with pytest.raises(pool.NoBackendCanRun) as caught:
            await asyncio.wait_for(p.acquire(flux(), "x"), 2)
    assert "no GPU has the model file flux1-schnell" in str(caught.value)
    assert not caught.value.transient


async def test_a_dead_backend_is_marked_down_and_comes_back_when_it_answers_again(
    fake_comfy_factory,
) -> None:
    fake = await fake_comfy_factory()
    async with pool.Pool(backend_configs([fake.url]), probe_interval=0.1) as p:
        backend = p.get("gpu0")
        assert backend is not None and backend.healthy
        await fake.kill()
        await wait_for(lambda: _true(not backend.healthy), timeout=5)
        assert p.free_backends() == [] and not p.any_healthy
        waited: list[str] = []

        async def on_wait(text: str) -> None:
            waited.append(text)

        pending = asyncio.create_task(p.acquire(flux(), "x", on_wait=on_wait))
        await asyncio.sleep(0.3)
        assert waited == ["waiting for a GPU"] and not pending.done()
        await fake.start()
        slot = await asyncio.wait_for(pending, 10)
        assert slot.backend is backend and backend.healthy and backend.failures == 0
        await p.release(slot)


async def test_jobs_other_workers_put_on_a_backend_count_against_its_slots(
    fake_comfy_factory,
) -> None:
    busy = await fake_comfy_factory()
    busy.pause()  # queued prompts stay queued
    idle = await fake_comfy_factory()
    async with pool.Pool(backend_configs([busy.url, idle.url]), probe_interval=0.1) as p:
        b = p.get("gpu0")
        assert b is not None
        # Another process fills gpu0's queue behind our back.
        graph = flux().apply(flux().validate({"prompt": "x", "width": 256, "height": 256}))
        for _ in range(2):
            await b.client.submit(graph)
        await wait_for(lambda: _true(b.remote_queue == 2), timeout=5)
        assert p.free_backends() == ["gpu1"]
        busy.resume()


async def test_a_refused_job_reads_the_model_lists_again_before_it_is_refused(
    fake_comfy_factory,
) -> None:
    """A model installed since the last read (minutes apart) runs at once: the pool reads
    the lists again when they would refuse a job and are more than a few seconds old."""
    import copy

    from tests.fakes.comfyui import DEFAULT_MODELS

    empty = await fake_comfy_factory(models={"checkpoints": [], "diffusion_models": [],
                                             "text_encoders": [], "vae": []})
    async with pool.Pool(backend_configs([empty.url])) as p:
        with pytest.raises(pool.NoBackendCanRun):
            await asyncio.wait_for(p.acquire(flux(), "x"), 2)
        empty.models = copy.deepcopy(DEFAULT_MODELS)  # installed on the GPU host
        empty._node_defs = empty._build_object_info()
        backend = p.get("gpu0")
        assert backend is not None
        backend.capabilities_at -= health.REFUSAL_REFRESH + 1
        slot = await asyncio.wait_for(p.acquire(flux(), "y"), 5)
        assert slot.backend.name == "gpu0"
        await p.release(slot)


async def test_a_restart_while_a_gpu_is_down_still_knows_what_it_lacks(
    fake_comfy_factory, db
) -> None:
    """The lists a backend last answered are kept in the database: a process started
    while that GPU is down refuses what it cannot run at once (and /help does not offer
    it), instead of offering everything and keeping the job waiting for the GPU."""
    import copy

    from comfyveil.desk import availability
    from tests.fakes.comfyui import DEFAULT_MODELS

    lacking = await fake_comfy_factory(models={"checkpoints": [], "diffusion_models": [],
                                               "text_encoders": [], "vae": []})
    configs = backend_configs([lacking.url])
    async with pool.Pool(configs, memory=db.model_lists) as p:
        assert p.why_not(flux()) is not None  # read while it answered
    await lacking.partition()
    async with pool.Pool(configs, memory=db.model_lists) as p:
        backend = p.get("gpu0")
        assert backend is not None and not backend.healthy
        assert availability.reason(p, flux()) == availability.NO_MODEL
        with pytest.raises(pool.NoBackendCanRun) as caught:
            await asyncio.wait_for(p.acquire(flux(), "x"), 2)
        assert "flux1-schnell" in str(caught.value)
        # Once it answers, its own lists count again (here: the model was installed).
        lacking.models = copy.deepcopy(DEFAULT_MODELS)
        lacking._node_defs = lacking._build_object_info()
        await lacking.heal()
        await p.probe(backend)
        assert backend.healthy and not backend.remembered
        assert p.why_not(flux()) is None
    await lacking.partition()
    async with pool.Pool(configs, memory=db.model_lists) as p:  # the new lists were kept
        assert not p.get("gpu0").healthy and p.why_not(flux()) is None


async def test_a_backend_too_slow_to_answer_its_probe_is_down_in_plain_words(
    fake_comfy_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU behind anon that is slow to answer after anon restarted: the operator reads
    why it is down (`comfyveil worker` prints it at start), not an exception's name."""
    monkeypatch.setattr(health, "PROBE_TIMEOUT", 0.5)
    fake = await fake_comfy_factory()
    fake.hold("/queue")
    try:
        async with pool.Pool(backend_configs([fake.url]), probe_interval=60) as p:
            backend = p.get("gpu0")
            assert backend is not None and not backend.healthy
            assert backend.last_error == "backend gpu0 did not answer within 0.5 s"
    finally:
        fake.release("/queue")


async def test_a_probe_on_its_way_when_the_backend_is_marked_down_does_not_bring_it_up(
    fake_comfy_factory,
) -> None:
    """A job finds the backend unreachable while a probe sent before waits for its answer:
    that answer may be from before the failure, so the backend stays down for its backoff
    (it came back up at once, and a retry went straight back to it)."""
    fake = await fake_comfy_factory()
    async with pool.Pool(backend_configs([fake.url]), probe_interval=60) as p:
        backend = p.get("gpu0")
        assert backend is not None and backend.healthy
        fake.hold("/queue")
        try:
            probing = asyncio.create_task(p.probe(backend))
            await wait_for(lambda: _true(fake.held["GET /queue"] == 1), timeout=5)
            await p.mark_down(backend, "backend gpu0 cannot be reached")
        finally:
            fake.release("/queue")
        assert await asyncio.wait_for(probing, 5) is False
        assert not backend.healthy and backend.failures == 1
        assert await p.probe(backend)  # one sent after it does
        assert backend.healthy and backend.failures == 0


async def test_callers_probing_a_backend_at_once_share_one_probe(fake_comfy_factory) -> None:
    """Three jobs' retries wait for a cut-off backend, each probing it, beside the health
    loop: one probe goes out and all hear its answer. A probe of a backend that is down
    reads its /object_info too; through anon four such reads at once outlasted the
    probe's deadline together and voided each other, and one worker saw the backend down
    for a minute and a half while the other processes reached it (chaos, anon mode)."""
    fake = await fake_comfy_factory()
    async with pool.Pool(backend_configs([fake.url]), probe_interval=60) as p:
        backend = p.get("gpu0")
        assert backend is not None and backend.healthy
        await p.mark_down(backend, "backend gpu0 cannot be reached")
        fake.hold("/object_info")
        try:
            probes = [asyncio.create_task(p.probe(backend)) for _ in range(3)]
            await wait_for(lambda: _true(fake.held["GET /object_info"] >= 1), timeout=5)
            await asyncio.sleep(0.2)  # time for the others' requests to arrive, if sent
            assert fake.held["GET /object_info"] == 1
        finally:
            fake.release("/object_info")
        assert await asyncio.wait_for(asyncio.gather(*probes), 5) == [True, True, True]
        assert backend.healthy
        probe_queue_reads = [r for r in fake.requests if r.path.endswith("/queue")]
        assert await p.probe(backend)  # the next probe is a probe of its own
        assert len([r for r in fake.requests if r.path.endswith("/queue")]) == (
            len(probe_queue_reads) + 1
        )


async def test_jobs_failing_on_a_backend_already_down_do_not_put_its_next_probe_off(
    fake_comfy_factory,
) -> None:
    """The jobs on a GPU whose way was cut fail together, and their retries fail again:
    only the first takes it down. Each had doubled the wait for the next probe and put it
    off anew, so the GPU stayed down for up to 155 s in a worker with several jobs
    there, while the other processes saw it up within seconds (chaos, anon mode)."""
    fake = await fake_comfy_factory()
    async with pool.Pool(backend_configs([fake.url])) as p:
        backend = p.get("gpu0")
        assert backend is not None and backend.healthy
        await fake.partition()
        for _ in range(7):  # the first job's failure, then the others' and their retries'
            await p.mark_down(backend, "backend gpu0 cannot be reached")
        assert not backend.healthy
        await fake.heal()
        await wait_for(lambda: _true(backend.healthy), timeout=5)
