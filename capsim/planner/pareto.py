"""Pareto frontiers: the configurations no other beats on every objective."""

from __future__ import annotations

from collections.abc import Sequence


def pareto_front(points: Sequence[tuple[float, ...]], maximize: Sequence[bool]) -> list[int]:
    """Indices of the non-dominated points. ``maximize[k]`` says whether objective k is
    better higher (True) or lower (False)."""
    signed = [tuple(v if up else -v for v, up in zip(p, maximize, strict=True)) for p in points]
    front = []
    for i, p in enumerate(signed):
        dominated = any(
            all(q[k] >= p[k] for k in range(len(p))) and any(q[k] > p[k] for k in range(len(p)))
            for j, q in enumerate(signed)
            if j != i
        )
        if not dominated:
            front.append(i)
    return front
