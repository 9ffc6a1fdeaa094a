"""The one ETA every front end shows (store/eta.py): the routing estimator, the jobs
running now and the queue ahead, backend by backend."""

from __future__ import annotations

import uuid

import pytest

from comfyveil.store import eta


def taught(*runs: tuple[str, str, float]) -> eta.Model:
    return eta.estimator_from(eta.Run(b, c, s) for b, c, s in runs)


WARM = [("gpu0", "f", 10.0), ("gpu0", "f", 10.0), ("gpu1", "f", 10.0), ("gpu1", "f", 10.0)]


def test_the_jobs_running_now_count_for_what_they_still_need() -> None:
    estimator = taught(*WARM)
    busy = [eta.Busy("gpu0", "f", 4.0), eta.Busy("gpu1", "f", 8.0)]
    wait = eta.estimate(estimator, command="f", backends=["gpu0", "gpu1"], busy=busy)
    # gpu1 is free in 2 s, then ours takes 10: not 10 s as if both GPUs were idle.
    assert wait.seconds == pytest.approx(12.0)
    assert wait.backend == "gpu1" and wait.running == {"gpu0": 1, "gpu1": 1}


def test_a_job_running_past_its_estimate_still_holds_its_gpu() -> None:
    estimator = taught(*WARM)
    busy = [eta.Busy("gpu0", "f", 30.0)]  # 20 s past its 10 s estimate, no progress known
    wait = eta.estimate(estimator, command="f", backends=["gpu0"], busy=busy)
    # Not "nearly done": the estimate was wrong, it is expected to run half as long again.
    assert wait.seconds == pytest.approx(30.0 * eta.OVERRUN_SHARE + 10.0)
    running = eta.estimate(estimator, command="f", backends=["gpu0"], on="gpu0", elapsed=30.0)
    assert running.seconds == pytest.approx(15.0)  # never "0 s", nor "1 s", while it runs


def test_the_queue_ahead_is_split_by_backend_as_the_pool_would_send_it() -> None:
    estimator = taught(*WARM)
    ahead = [eta.Ahead("f"), eta.Ahead("f"), eta.Ahead("f", ("gpu0",))]
    busy = [eta.Busy("gpu0", "f", 9.0)]
    wait = eta.estimate(estimator, command="f", backends=["gpu0", "gpu1"], busy=busy, ahead=ahead)
    # gpu1 idle takes the first (done at 10), gpu0 free at 1 takes the second (done at
    # 11), the third may only use gpu0 (done at 21); ours then goes to gpu1 (done at 20).
    assert wait.ahead == 3
    assert wait.ahead_by_backend == {"gpu0": 2, "gpu1": 1}
    assert wait.seconds == pytest.approx(20.0) and wait.backend == "gpu1"


def test_a_model_switch_costs_what_the_cold_runs_measured() -> None:
    # On gpu0, /f warm takes 10 s; its runs after /sd took 14: a switch costs 4 s.
    estimator = taught(
        ("gpu0", "f", 10.0),
        ("gpu0", "f", 10.0),
        ("gpu0", "sd", 5.0),
        ("gpu0", "f", 14.0),
        ("gpu0", "f", 10.0),
    )
    assert estimator.run_seconds("gpu0", "f") == pytest.approx(10.0)
    assert estimator.cold_seconds("gpu0", "f") == pytest.approx(4.0)
    warm = eta.estimate(estimator, command="f", backends=["gpu0"], last_command={"gpu0": "f"})
    cold = eta.estimate(estimator, command="f", backends=["gpu0"], last_command={"gpu0": "sd"})
    assert warm.seconds == pytest.approx(10.0) and cold.seconds == pytest.approx(14.0)


def test_nothing_measured_of_the_command_gives_no_eta() -> None:
    wait = eta.estimate(taught(*WARM), command="new", backends=["gpu0"])
    assert wait.seconds is None


def test_a_gpu_down_is_left_out_and_the_eta_grows() -> None:
    estimator = taught(*WARM)
    ahead = [eta.Ahead("f")]
    both = eta.estimate(estimator, command="f", backends=["gpu0", "gpu1"], ahead=ahead)
    one = eta.estimate(estimator, command="f", backends=["gpu0"], ahead=ahead)
    assert both.seconds == pytest.approx(10.0) and one.seconds == pytest.approx(20.0)


def test_the_place_shown_never_goes_back() -> None:
    memory = eta.PlaceMemory(size=2)
    job = uuid.uuid4()
    assert memory.place(job, 2) == 2
    assert memory.place(job, 1) == 1
    assert memory.place(job, 2) == 1  # another user's job went ahead: still "#1"
    for _ in range(2):
        memory.place(uuid.uuid4(), 5)
    assert memory.place(job, 3) == 3  # forgotten beyond `size` jobs: shown as it is


def test_the_eta_shown_does_not_jump_back_up_but_follows_good_news_at_once() -> None:
    memory = eta.EtaMemory()
    job = uuid.uuid4()
    assert memory.seconds(job, 20.0, now=100.0) == 20.0
    # 5 s later it would be 15 s; a new estimate of 30 s is let in a fifth at a time.
    assert memory.seconds(job, 30.0, now=105.0) == pytest.approx(15.0 * 1.2)
    assert memory.seconds(job, 30.0, now=106.0) == pytest.approx(17.0 * 1.2)
    assert memory.seconds(job, 4.0, now=107.0) == 4.0  # sooner: shown at once
    assert memory.seconds(job, None, now=108.0) is None  # nothing known: nothing shown


def test_a_first_run_on_a_backend_of_unknown_warmth_counts_only_without_better() -> None:
    # gpu0's first run in the window (45 s, a cold start most likely) is left out once
    # warm runs of /f there are known; gpu1 has nothing else: it is all there is.
    estimator = taught(("gpu0", "f", 45.0), ("gpu0", "f", 10.0), ("gpu1", "f", 12.0))
    assert estimator.run_seconds("gpu0", "f") == pytest.approx(10.0)
    assert estimator.run_seconds("gpu1", "f") == pytest.approx(12.0)


def test_a_run_starts_when_the_one_before_it_on_its_backend_ended() -> None:
    runs = eta.runs_from(
        [("gpu0", "f", 0.0, 10.0), ("gpu0", "f", 1.0, 20.0), ("gpu1", "f", 5.0, 15.0)]
    )
    assert [(r.backend, r.seconds) for r in runs] == [
        ("gpu0", 10.0),
        ("gpu1", 10.0),
        ("gpu0", 10.0),
    ]


def test_a_run_comfyui_timed_loading_models_is_not_taken_for_a_slow_warm_one() -> None:
    # gpu0's only run of /f took 45 s, 35 of them in its loaders (the worker kept
    # ComfyUI's timings); then /sd ran there with /f's models still loaded (both fit).
    runs = eta.runs_from(
        [
            ("gpu0", "f", 0.0, 45.0, 1.0, None, None, True, 35.0),
            ("gpu0", "sd", 45.0, 53.0, 1.0, None, None, False, None),
        ]
    )
    model = eta.estimator_from(runs)
    assert model.run_seconds("gpu0", "f") == pytest.approx(10.0)
    assert model.cold_seconds("gpu0", "f") == pytest.approx(35.0)
    assert model.run_seconds("gpu0", "sd") == pytest.approx(8.0)  # no switch taken off
    assert model.switch_share == pytest.approx(0.5)  # one of the two loaded models


def test_the_estimate_grows_with_the_steps_and_pixels_asked_for() -> None:
    # /f at 4 steps of 512x512 (a step per quarter megapixel: 1 unit of work) took 5 s,
    # at 8 steps of 1024x1024 (8 units) 33 s: 1 s fixed and 4 s per unit.
    small = eta.work_of({"steps": 4, "width": 512, "height": 512})
    large = eta.work_of({"steps": 8, "width": 1024, "height": 1024})
    assert large == pytest.approx(8 * small)
    model = eta.estimator_from(
        [eta.Run("gpu0", "f", 1.0 + 4.0 * small, small)] * 2
        + [eta.Run("gpu0", "f", 1.0 + 4.0 * large, large)] * 2
    )
    assert model.run_seconds("gpu0", "f", small) == pytest.approx(5.0)
    assert model.run_seconds("gpu0", "f", large) == pytest.approx(33.0)
    mid = eta.estimate(model, command="f", backends=["gpu0"], work=2 * small)
    assert mid.seconds == pytest.approx(9.0)  # neither 5 s nor 33 s: what it asks


def test_one_odd_warm_run_does_not_set_the_pace_the_cold_runs_there_measured() -> None:
    """The sampler starts once the models are loaded, so a cold run's pace is as good as a
    warm one's. The benchmark's first warm run of Flux Schnell on one GPU read its steps
    late (three times the pace) and alone set the rate: every ETA of that workflow there
    rose by 5 s, and fell back two runs later."""
    rate, fixed = 0.2, 0.3  # seconds per unit of work; decoding, saving, sending
    cold = [
        eta.Run("gpu0", "f", 3.0 + fixed + rate * work, work, steps=steps,
                step_s=rate * work / steps, cold=True, load=3.0)
        for work, steps in ((2.0, 2), (1.75, 7), (1.125, 2))
    ]  # fmt: skip
    odd = eta.Run("gpu0", "f", fixed + rate * 0.75, 0.75, steps=3, step_s=0.157, cold=False)
    model = eta.estimator_from([*cold, odd])
    assert model.run_seconds("gpu0", "f", 8.0) == pytest.approx(fixed + rate * 8.0, rel=0.1)


def test_a_running_job_still_needs_its_steps_left_at_the_pace_it_showed() -> None:
    # Learnt from progress events: 0.5 s a step of 20, 2 s of loading and decoding.
    model = eta.estimator_from([eta.Run("gpu0", "f", 12.0, 1.0, steps=20, step_s=0.5)] * 3)
    # This one is slower than its estimate (1 s a step): 12 steps left need 12 s, not
    # the 12 - 9 = 3 s its estimate leaves after 9 s.
    running = eta.estimate(
        model,
        command="f",
        backends=["gpu0"],
        on="gpu0",
        elapsed=9.0,
        steps=20,
        done=8,
        step_s=1.0,
    )
    assert running.seconds == pytest.approx(12 * 1.0 + 2.0 * eta.TAIL_SHARE)
    # Before its first step, a job never needs less than all its steps.
    fresh = eta.estimate(
        model,
        command="f",
        backends=["gpu0"],
        on="gpu0",
        elapsed=11.5,
        steps=20,
    )
    assert fresh.seconds == pytest.approx(20 * 0.5)


SWITCHED = [
    # f warm 10 s, sd 5 s; f after sd 14 s: a switch to f costs 4 s.
    ("gpu0", "f", 10.0),
    ("gpu0", "f", 10.0),
    ("gpu0", "sd", 5.0),
    ("gpu0", "f", 14.0),
    ("gpu0", "f", 10.0),
    ("gpu1", "sd", 5.0),
    ("gpu1", "sd", 5.0),
]


def test_a_queued_job_is_counted_where_the_pool_will_send_it_and_the_jobs_ahead() -> None:
    model = taught(*SWITCHED)
    # gpu0 holds f's models, gpu1 sd's; three f jobs ahead, then ours (f), nobody behind.
    wait = eta.estimate(
        model,
        command="f",
        backends=["gpu0", "gpu1"],
        ahead=[eta.Ahead("f"), eta.Ahead("f"), eta.Ahead("f")],
        last_command={"gpu0": "f", "gpu1": "sd"},
    )
    # As the pool sends them (a backend holds two: one running, one waiting): the first
    # to gpu0 (done at 10); the second to gpu1, which loads f (4 + 10: done at 14, not
    # 20 behind the first); the third to gpu0 (done at 20, where gpu1 would take 24).
    # Ours: gpu0 holds two now; gpu1 has room and, f loaded by then, has it done at 24.
    assert wait.ahead_by_backend == {"gpu0": 2, "gpu1": 1}
    assert wait.backend == "gpu1"
    assert wait.seconds == pytest.approx(24.0)


def test_a_running_job_that_loads_its_models_counts_the_load_whatever_waits_behind_it() -> None:
    model = taught(*SWITCHED)  # f warm 10 s; a switch to f costs 4 s
    # gpu0 held sd's models; ours (f) started there 1 s ago, no step done yet, and another
    # f job waits behind it.
    wait = eta.estimate(
        model,
        command="f",
        backends=["gpu0"],
        busy=[eta.Busy("gpu0", "f", None)],
        on="gpu0",
        elapsed=1.0,
        last_command={"gpu0": "sd"},
    )
    # It loads f's models first: 4 + 10 - 1 s left, not 9 as if the job behind it, which
    # runs after it, had loaded them.
    assert wait.seconds == pytest.approx(13.0)


def test_a_long_queue_of_one_workflow_on_gpus_holding_its_models_pays_no_switch() -> None:
    model = taught(*SWITCHED)  # two runs in five lately switched models
    assert model.switch_share > 0.3
    # Both GPUs hold f's models; twelve f jobs ahead, then ours (f), 10 s each. The pool
    # sends each to the GPU with a free slot, and none loads other models: ours is the
    # 13th, the 7th on its GPU, done at 70 s. Counting deep jobs as switching as often as
    # runs lately did said 76 s.
    wait = eta.estimate(
        model,
        command="f",
        backends=["gpu0", "gpu1"],
        ahead=[eta.Ahead("f")] * 12,
        last_command={"gpu0": "f", "gpu1": "f"},
    )
    assert wait.seconds == pytest.approx(70.0, rel=0.04)


def test_a_job_ahead_goes_to_a_free_slot_not_behind_a_faster_gpu_full_already() -> None:
    # gpu0 runs f in 2 s, gpu1 in 10 s; three f jobs ahead, then ours.
    model = taught(("gpu0", "f", 2.0), ("gpu0", "f", 2.0), ("gpu1", "f", 10.0), ("gpu1", "f", 10.0))
    wait = eta.estimate(model, command="f", backends=["gpu0", "gpu1"], ahead=[eta.Ahead("f")] * 3)
    # gpu0 takes two (done at 2 and 4); with its slots full and a job behind, the pool
    # sends the third to the free gpu1 (done at 10), not behind gpu0's two (done at 6).
    # Ours, the last, waits in gpu0's queue: done at 6 (counting the third on gpu0 said 8).
    assert wait.ahead_by_backend == {"gpu0": 2, "gpu1": 1}
    assert wait.backend == "gpu0" and wait.seconds == pytest.approx(6.0)


def test_a_job_ahead_pays_a_model_switch_only_where_it_lands_on_other_models() -> None:
    model = taught(*SWITCHED)
    wait = eta.estimate(
        model,
        command="f",
        backends=["gpu0"],
        ahead=[eta.Ahead("sd")],
        last_command={"gpu0": "sd"},
    )
    # One GPU holding sd's models: the job ahead finds them loaded (no switch), ours
    # switches to f after it (10 + 4 s): a switch counted for sure, where each one lands.
    sd = model.run_seconds("gpu0", "sd")
    assert sd is not None
    assert wait.seconds == pytest.approx(sd + 10.0 + 4.0)


def test_a_command_seen_only_cold_is_not_charged_its_model_load_on_every_run() -> None:
    # sd ran once, right after f (a switch: 9 s); no warm sd run yet. A switch to f was
    # measured at 4 s over its warm run: sd's load is taken to cost as much.
    model = taught(
        ("gpu0", "f", 10.0),
        ("gpu0", "f", 10.0),
        ("gpu0", "sd", 9.0),
        ("gpu0", "f", 14.0),
    )
    warm = eta.estimate(model, command="sd", backends=["gpu0"], last_command={"gpu0": "sd"})
    cold = eta.estimate(model, command="sd", backends=["gpu0"], last_command={"gpu0": "f"})
    # Before: 9 s either way, until a warm run of sd came and every ETA fell at once.
    assert warm.seconds == pytest.approx(5.0) and cold.seconds == pytest.approx(9.0)


def two_gpus_switching() -> eta.Model:
    """Both GPUs: 1 s plus 1 s a unit of work for Flux and SD 3.5; a model switch, 3 s."""
    return eta.estimator_from(
        eta.Run(b, c, 2.0 + (3.0 if i == 0 else 0.0), 1.0, 4, 0.25)
        for b in ("gpu0", "gpu1")
        for c in ("f", "sd3", "f", "sd3")
        for i in range(3)
    )


def test_an_eta_does_not_flip_with_the_order_two_gpus_free_up_in() -> None:
    model = two_gpus_switching()

    def seconds(done_on_gpu1: float) -> float:
        # gpu0 (Flux loaded) runs a long Flux job, 7 s left, one more waits there; gpu1
        # (SD 3.5 loaded) ends its job in about 3 s and takes the next Flux job ahead,
        # done in about 7 s too: which of them frees first decides where the two SD 3.5
        # jobs ahead land and whether ours (Flux) pays a switch.
        wait = eta.estimate(
            model,
            command="f",
            backends=["gpu0", "gpu1"],
            busy=[
                eta.Busy("gpu0", "f", 6.0, 8.0, 8, 2.0, 1.0),
                eta.Busy("gpu0", "f", None, 0.6),
                eta.Busy("gpu1", "f", 2.0, 4.0, 4, done_on_gpu1, 1.0),
            ],
            ahead=[
                eta.Ahead("f", None, 3.0),
                eta.Ahead("sd3", None, 2.0),
                eta.Ahead("sd3", None, 2.0),
            ],
            last_command={"gpu0": "f", "gpu1": "sd3"},
            work=2.0,
        )
        assert wait.seconds is not None
        return wait.seconds

    # gpu1 a tenth of a step further along: gpu1 now frees first, not gpu0. Taken as one
    # order or the other, the ETA fell from 19 s to 11.6 s; it is the mean over the
    # likely orders, between the two, and moves by a few percent.
    before, after = seconds(1.95), seconds(2.05)
    assert 11.6 < after <= before < 19.1
    assert after / before > 0.9


def test_a_close_call_ahead_kept_to_its_announced_gpu_does_not_move_the_eta() -> None:
    model = two_gpus_switching()
    loaded = {"gpu0": "f", "gpu1": "sd3"}
    # gpu0 (Flux loaded) has 2 s to go; gpu1 (SD 3.5 loaded) is free. A Flux job ahead
    # either loads Flux on gpu1 or waits for gpu0: a close call, which decides whether
    # ours (SD 3.5) finds gpu1 free and warm.
    running = eta.Busy("gpu0", "f", 2.0, 4.0, 4, 2.0, 1.0)

    def before(plan: str | None) -> float:
        wait = eta.estimate(
            model,
            command="sd3",
            backends=["gpu0", "gpu1"],
            busy=[running],
            ahead=[eta.Ahead("f", None, 2.0, key="ahead", plan=plan)],
            last_command=loaded,
            work=2.0,
        )
        assert wait.seconds is not None
        return wait.seconds

    def once_sent_to(backend: str) -> float:
        wait = eta.estimate(
            model,
            command="sd3",
            backends=["gpu0", "gpu1"],
            busy=[running, eta.Busy(backend, "f", None, 2.0)],
            last_command=loaded,
            work=2.0,
        )
        assert wait.seconds is not None
        return wait.seconds

    # Unplanned, the ETA is the mean of the two outcomes, and moves by more than a
    # fifth whichever way the pool decides.
    unplanned = before(None)
    for backend in ("gpu0", "gpu1"):
        assert abs(once_sent_to(backend) / unplanned - 1) > 0.2
    # Announced on gpu0, it is counted there, and the pool keeps it there: no move.
    assert before("gpu0") == pytest.approx(once_sent_to("gpu0"), rel=0.05)
