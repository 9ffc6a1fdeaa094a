from __future__ import annotations

import pytest

from comfyveil.bench import stats


def test_seed_speedup_matches_the_seed_table() -> None:
    # The seed's SD3.5 row: 4090 8.96 s, 5090 5.96 s, speedup 33.48 %.
    assert stats.speedup(8.96, 5.96) == pytest.approx(0.3348, abs=1e-4)
    assert stats.ratio(8.96, 5.96) == pytest.approx(1.503, abs=1e-3)
    # Flux Schnell: 4.92 -> 1.80 is 63.41 %.
    assert stats.speedup(4.92, 1.80) == pytest.approx(0.6341, abs=1e-4)


def test_speedup_is_negative_when_the_other_backend_is_slower() -> None:
    assert stats.speedup(2.0, 3.0) == pytest.approx(-0.5)
    assert stats.ratio(2.0, 3.0) == pytest.approx(2 / 3)


def test_missing_figures_give_no_speedup() -> None:
    assert stats.speedup(None, 1.0) is None
    assert stats.speedup(1.0, None) is None
    assert stats.ratio(1.0, 0.0) is None


def test_summary_of_durations() -> None:
    s = stats.summarize([4.0, 1.0, 3.0, 2.0, 10.0], failed=2)
    assert (s.n, s.failed) == (5, 2)
    assert s.mean == pytest.approx(4.0)
    assert s.median == pytest.approx(3.0)
    assert s.min == 1.0 and s.max == 10.0
    assert s.stdev == pytest.approx(3.5355, abs=1e-4)
    # Linear interpolation between ranks: position 3.6 between 4.0 and 10.0.
    assert s.p90 == pytest.approx(7.6)


def test_single_run_has_zero_spread_and_no_runs_have_no_figures() -> None:
    one = stats.summarize([2.5])
    assert one.stdev == 0.0 and one.p90 == 2.5
    none = stats.summarize([], failed=3)
    assert none.n == 0 and none.failed == 3 and none.mean is None


def test_percentile_bounds() -> None:
    assert stats.percentile([1.0, 2.0, 3.0], 0) == 1.0
    assert stats.percentile([1.0, 2.0, 3.0], 100) == 3.0
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)
