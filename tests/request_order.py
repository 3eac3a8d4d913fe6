"""The order of a run's sends and finishes: what a probe's workload did, whatever the
host's speed (a test on it holds on a busy host as on a quiet one)."""

from __future__ import annotations


def in_flight_at_sends(requests: list[dict]) -> list[int]:
    """For each request (run-log records with ``send`` and ``finish``) in the order sent,
    how many were in flight (sent, not finished) the moment it was sent, itself included."""
    ordered = sorted(requests, key=lambda r: r["send"])
    return [sum(o["send"] <= r["send"] < o["finish"] for o in ordered) for r in ordered]
