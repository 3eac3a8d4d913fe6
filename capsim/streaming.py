"""Streaming summaries of a set of values: exact count, mean, minimum and maximum, and
percentiles from a log-binned histogram whose bins are 1% wide.

A simulation of millions of requests cannot keep every request's latency to take
percentiles from; ``LogSketch`` folds values in batches and keeps a few thousand bin
counts instead (the DDSketch construction: Masson, Rim and Lee, "DDSketch: a fast and
fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RELATIVE_ERROR = 0.005
"""Relative accuracy of a LogSketch percentile (0.5%): a positive value x falls in the
bin (g^(i-1), g^i] with g = (1 + a) / (1 - a), and the bin reports 2 g^i / (g + 1), which
is within a * x of x. So a percentile the sketch reports is within 0.5% of the exact one:
for numpy's linear interpolation between the order statistics x_k and x_k+1 (unweighted)
the estimate interpolates the two bins' values in the same proportion, and for the
inverted CDF (weighted) it is the bin of the exact answer itself. Both are clipped to the
exact minimum and maximum. Values of either sign are binned by magnitude; zero is exact."""

_CHUNK = 65_536
"""Values binned at a time (bounds the temporary arrays of one ``add``)."""

_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)


class _Bins:
    """Weights of values of one sign by bin index ceil(log_g |x|), in a dense array that
    grows to cover the indices seen."""

    __slots__ = ("offset", "weights")

    def __init__(self) -> None:
        self.offset = 0  # bin index of weights[0]
        self.weights = np.zeros(0)

    def _cover(self, lo: int, hi: int) -> None:
        """Grow the array to hold bin indices ``lo`` to ``hi``."""
        if self.weights.size == 0:
            self.offset, self.weights = lo, np.zeros(hi - lo + 1)
            return
        end = self.offset + self.weights.size - 1
        if lo >= self.offset and hi <= end:
            return
        new_lo, new_hi = min(lo, self.offset), max(hi, end)
        grown = np.zeros(new_hi - new_lo + 1)
        start = self.offset - new_lo
        grown[start : start + self.weights.size] = self.weights
        self.offset, self.weights = new_lo, grown

    def add(self, magnitudes: np.ndarray, weights: np.ndarray) -> None:
        index = np.ceil(np.log(magnitudes) / _LOG_GAMMA).astype(np.int64)
        self._cover(int(index.min()), int(index.max()))
        self.weights += np.bincount(index - self.offset, weights, minlength=self.weights.size)

    def merge(self, other: _Bins) -> None:
        if other.weights.size == 0:
            return
        self._cover(other.offset, other.offset + other.weights.size - 1)
        start = other.offset - self.offset
        self.weights[start : start + other.weights.size] += other.weights

    def values(self) -> np.ndarray:
        """Each bin's reported magnitude."""
        return _representative(np.arange(self.weights.size) + self.offset)


def _representative(index: np.ndarray) -> np.ndarray:
    """The magnitude bin ``index`` reports (within RELATIVE_ERROR of all it holds)."""
    return 2.0 * np.exp(index * _LOG_GAMMA) / (_GAMMA + 1.0)


class LogSketch:
    """Count, weighted mean, minimum, maximum and percentiles of values folded in batches.

    Unweighted (``weighted`` False), percentiles follow numpy's default linear
    interpolation; weighted, the inverted CDF of ``metrics.weighted_percentiles`` (the
    smallest value whose cumulative weight reaches q% of the total). The mean, minimum
    and maximum are exact (the mean up to float rounding of the sums); percentiles are
    within RELATIVE_ERROR of the exact ones. Memory: one float per 1% of dynamic range
    (about 2,800 bins, 22 KB, from 1 ns to 1,000 s), whatever the number of values.
    """

    def __init__(self, weighted: bool = False):
        self.weighted = weighted
        self.count = 0  # values folded
        self.total_weight = 0.0
        self.weighted_sum = 0.0  # sum of value x weight
        self.minimum = math.inf
        self.maximum = -math.inf
        self._positive = _Bins()
        self._negative = _Bins()
        self._zero = 0.0  # weight of values equal to 0

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Fold ``values`` (finite) in, with ``weights`` (non-negative; weighted sketches
        only; default 1 each)."""
        values = np.asarray(values, dtype=float)
        if values.size == 0:
            return
        if weights is None:
            if self.weighted:
                raise ValueError("a weighted sketch needs weights")
            w = np.ones(values.size)
        else:
            if not self.weighted:
                raise ValueError("an unweighted sketch takes no weights")
            w = np.asarray(weights, dtype=float)
        self.count += int(values.size)
        self.total_weight += float(w.sum())
        self.weighted_sum += float(np.dot(values, w))
        self.minimum = min(self.minimum, float(values.min()))
        self.maximum = max(self.maximum, float(values.max()))
        for start in range(0, values.size, _CHUNK):
            v, u = values[start : start + _CHUNK], w[start : start + _CHUNK]
            positive, negative = v > 0, v < 0
            if positive.any():
                self._positive.add(v[positive], u[positive])
            if negative.any():
                self._negative.add(-v[negative], u[negative])
            self._zero += float(u[v == 0].sum())

    def merge(self, other: LogSketch) -> None:
        """Fold another sketch's values in (as if they had been added here)."""
        if other.weighted != self.weighted:
            raise ValueError("cannot merge a weighted and an unweighted sketch")
        self.count += other.count
        self.total_weight += other.total_weight
        self.weighted_sum += other.weighted_sum
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)
        self._positive.merge(other._positive)
        self._negative.merge(other._negative)
        self._zero += other._zero

    @property
    def mean(self) -> float | None:
        """Weighted mean of the values (None when there are none)."""
        if not self.count or self.total_weight <= 0:
            return None
        return self.weighted_sum / self.total_weight

    def _ladder(self) -> tuple[np.ndarray, np.ndarray]:
        """Every non-empty bin's reported value in increasing order, and its weight."""
        neg, pos = self._negative, self._positive
        values = np.concatenate((-neg.values()[::-1], [0.0], pos.values()))
        weights = np.concatenate((neg.weights[::-1], [self._zero], pos.weights))
        keep = weights > 0
        return values[keep], weights[keep]

    def _order_statistic(self, values: np.ndarray, cum: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The k-th smallest value (0-based): the exact minimum or maximum at the ends,
        else the value of the bin that holds it."""
        at = np.minimum(np.searchsorted(cum, k, side="right"), len(cum) - 1)
        estimate = np.where(k <= 0, self.minimum, values[at])
        return np.where(k >= self.count - 1, self.maximum, estimate)

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        """Percentiles ``qs`` (0-100) of the values folded so far (NaN when none)."""
        if not self.count:
            return [math.nan] * len(qs)
        values, weights = self._ladder()
        cum = np.cumsum(weights)
        if self.weighted:
            if cum[-1] <= 0:
                return [math.nan] * len(qs)
            targets = np.asarray(qs, dtype=float) / 100.0 * cum[-1]
            idx = np.minimum(np.searchsorted(cum, targets, side="left"), len(cum) - 1)
            estimates = values[idx]
        else:
            # numpy's linear interpolation between order statistics k and k + 1 (0-based)
            rank = np.asarray(qs, dtype=float) / 100.0 * (self.count - 1)
            k = np.floor(rank)
            lower, upper = (
                self._order_statistic(values, cum, k),
                self._order_statistic(values, cum, k + 1),
            )
            estimates = lower + (rank - k) * (upper - lower)
        return [float(v) for v in np.clip(estimates, self.minimum, self.maximum)]
