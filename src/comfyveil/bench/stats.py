"""Summary statistics for benchmark durations, and the seed's speedup.

The seed defines speedup as (t_base - t_other) / t_base: 0.33 means the other GPU
needs a third less time. We also give the plain ratio t_base / t_other (1.5 means
1.5 times as fast), which is what most people expect "speedup" to mean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Durations of the successful runs of one workflow on one backend (seconds)."""

    n: int  # successful runs
    failed: int
    mean: float | None
    median: float | None
    p90: float | None
    stdev: float | None  # sample standard deviation; 0 for a single run
    min: float | None
    max: float | None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks.

    Raises:
        ValueError: when there are no values or q is outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be between 0 and 100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float], failed: int = 0) -> Summary:
    """Summarize the durations of the successful runs; failed runs are only counted."""
    if not values:
        return Summary(0, failed, None, None, None, None, None, None)
    return Summary(
        n=len(values),
        failed=failed,
        mean=statistics.fmean(values),
        median=statistics.median(values),
        p90=percentile(values, 90),
        stdev=statistics.stdev(values) if len(values) > 1 else 0.0,
        min=min(values),
        max=max(values),
    )


def speedup(base: float | None, other: float | None) -> float | None:
    """The seed's speedup, (t_base - t_other) / t_base; None when either is missing."""
    if base is None or other is None or base <= 0:
        return None
    return (base - other) / base


def ratio(base: float | None, other: float | None) -> float | None:
    """How many times faster `other` is than `base`: t_base / t_other."""
    if base is None or other is None or other <= 0:
        return None
    return base / other
