from __future__ import annotations

import pytest

from comfyveil.bench import timing
from comfyveil.comfy import events


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _timer() -> tuple[timing.RunTimer, FakeClock]:
    clock = FakeClock()
    timer = timing.RunTimer(
        class_types={"1": "EmptyLatentImage", "3": "KSampler", "9": "SaveImage"}, clock=clock
    )
    return timer, clock


def test_node_times_sampler_speed_and_server_time() -> None:
    timer, clock = _timer()
    pid = "p1"
    timer.on_event(events.ExecutionStart(pid, 1_000_000))
    timer.on_event(events.ExecutionCached(pid, ("1",), 1_000_001))
    timer.on_event(events.Executing(pid, "3"))
    clock.now += 0.5  # model load before the first step
    for step in range(1, 11):
        clock.now += 0.1
        timer.on_event(events.Progress(pid, "3", float(step), 10.0))
    timer.on_event(events.Executing(pid, "9"))
    clock.now += 0.25
    timer.on_event(events.Executed(pid, "9", "9", {"images": []}))
    timer.on_event(events.ExecutionSuccess(pid, 1_001_800))
    timer.on_event(events.Executing(pid, None))

    nodes = timer.nodes()
    assert [(n.node, n.class_type) for n in nodes] == [("3", "KSampler"), ("9", "SaveImage")]
    assert nodes[0].seconds == pytest.approx(1.5)
    assert nodes[1].seconds == pytest.approx(0.25)
    # 9 steps between the first and the last progress event, 0.9 s apart: 10 it/s,
    # not diluted by the half second of loading before the first step.
    assert timer.sampler_its() == pytest.approx(10.0)
    assert timer.execution_s == pytest.approx(1.8)
    assert timer.cached == {"1"}


def test_error_closes_the_running_node_and_leaves_no_server_time() -> None:
    timer, clock = _timer()
    timer.on_event(events.ExecutionStart("p", 5000))
    timer.on_event(events.Executing("p", "3"))
    clock.now += 0.3
    timer.on_event(events.ExecutionError("p", "3", "KSampler", "out of memory", None))
    assert [n.seconds for n in timer.nodes()] == [pytest.approx(0.3)]
    assert timer.execution_s is None
    assert timer.sampler_its() is None


def test_progress_of_a_non_sampler_node_is_not_sampler_speed() -> None:
    timer, clock = _timer()
    timer.on_event(events.Executing("p", "9"))
    for step in range(3):
        clock.now += 0.1
        timer.on_event(events.Progress("p", "9", float(step), 3.0))
    assert timer.sampler_its() is None
