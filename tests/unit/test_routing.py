"""The pool's rule (comfy/routing.py, `choose`) with a job's announced backend: the
place its ETA named is kept unless the runs strayed far."""

from __future__ import annotations

from comfyveil.comfy import routing


def option(name: str, finish: float, load: int = 0, *, cold: bool = False) -> routing.Option:
    return routing.Option(name, finish, load, 2, cold)


def test_a_job_goes_to_the_gpu_its_eta_announced_at_a_close_call() -> None:
    # gpu1 is free but would load other models first; gpu0 holds them, busy, and would
    # finish the job a little later. With jobs behind, the rule takes the free one.
    free_cold, warm_busy = option("gpu1", 9.0, cold=True), option("gpu0", 9.5, 2)
    able, free = [free_cold, warm_busy], [free_cold]
    assert routing.choose(able, free, waited=0.0, behind=3) is free_cold
    # Its ETA said gpu0 (and every job behind counted it there): it goes there.
    assert routing.choose(able, free, waited=0.0, behind=3, planned="gpu0") is warm_busy


def test_a_plan_the_runs_strayed_far_from_gives_way_to_the_rule() -> None:
    free_cold = option("gpu1", 9.0, cold=True)
    late = option("gpu0", 9.0 * (1 + routing.STRAY) + 0.5, 2)
    assert routing.choose([free_cold, late], [free_cold], waited=0.0, behind=3, planned="gpu0") is (
        free_cold
    )


def test_a_job_waits_for_its_full_planned_gpu_while_it_still_finishes_there_in_time() -> None:
    """Sent elsewhere, it took a slot other planned jobs counted on, and they strayed in
    turn: every ETA behind them moved."""
    free = option("gpu1", 9.0)
    full = option("gpu0", 9.5, routing.OVERFLOW * 2)
    assert routing.choose([free, full], [free], waited=0.0, behind=1) is free
    assert routing.choose([free, full], [free], waited=0.0, behind=1, planned="gpu0") is None
    # No longer than a run on the free GPU would take (the rule's aging bound)...
    assert routing.choose([free, full], [free], waited=9.0, behind=1, planned="gpu0") is free
    # ...and not when it would finish there far later than where the rule sends it.
    far = option("gpu0", 9.0 * (1 + routing.STRAY) + 0.5, routing.OVERFLOW * 2)
    assert routing.choose([free, far], [free], waited=0.0, behind=1, planned="gpu0") is free


def test_a_plan_on_a_missing_gpu_gives_way_to_the_rule() -> None:
    free = option("gpu1", 9.0)
    # A backend that went down (or cannot run the job) is not among those able.
    assert routing.choose([free], [free], waited=0.0, behind=1, planned="gpu0") is free


def test_with_no_gpu_free_a_job_waits_plan_or_not() -> None:
    busy = option("gpu0", 5.0, 2)
    assert routing.choose([busy], [], waited=0.0, planned="gpu0") is None
