"""Small statistics for benchmark tables: medians, spread, percentiles."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median, min and max of the values that exist (None when none do)."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(present), "min": min(present), "max": max(present)}


def rounded(value: float | None, digits: int) -> float | None:
    """`value` rounded to `digits`; None stays None."""
    return None if value is None else round(value, digits)
