"""Reductions over the scheduler's short per-row arrays at the least cost a call.

numpy's ufunc reductions called as the ufunc methods themselves: ``ndarray.sum/min/max``
add a Python-level wrapper (numpy/_core/_methods.py) that costs about a microsecond a
call. Cheaper still where the result is the same: the least element found by ``argmin``
(no reduction machinery), and the sum of whole numbers (token and block counts, exact in
any order below 2**53) by Python's ``sum`` over a short array's list.
"""

import numpy as np

array_sum = np.add.reduce
array_min = np.minimum.reduce
array_max = np.maximum.reduce

SHORT = 64
"""Elements up to which Python's sum over the list beats numpy's reduction."""


def whole_sum(values: np.ndarray) -> float:
    """The sum of a 1-D float array of whole numbers (each sum exact), as a float."""
    if values.size <= SHORT:
        return float(sum(values.tolist()))
    return float(array_sum(values))


def least(values: np.ndarray) -> float:
    """The least element of a non-empty 1-D float array without NaN, as a float (what
    ``array_min`` gives)."""
    return float(values[values.argmin()])
