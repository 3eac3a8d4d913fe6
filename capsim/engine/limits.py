"""The largest workloads capsim simulates (no imports: the CLI checks flags against them
at start-up)."""

MAX_CONCURRENCY = 100_000
"""Highest concurrency (clients in a closed loop, agents of a plan) capsim simulates."""

MAX_GPUS = 16_384
"""The most GPUs one prediction simulates (every data-parallel replica is simulated)."""
