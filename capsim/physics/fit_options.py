"""The keyword arguments of ``memory_fit`` checked for their kind before the fit runs: the
Python API passes them straight through (issue 47, round 5), and a wrong kind must be a
CapsimUserError naming the argument, not a TypeError from inside the fit."""

from __future__ import annotations

from capsim.catalog.engine_schema import SlidingWindowPool


def _whole_or_none(value) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def check_fit_options(**options) -> None:
    """memory_fit's keyword arguments of the right kind, or a CapsimUserError naming the
    argument (issue 47, round 5: the Python API's memory_fit(max_num_seqs="x") was a
    TypeError, reserve=None an AttributeError, from inside the fit). A few isinstance
    tests: the planner calls memory_fit for every configuration."""
    from capsim.arguments import require
    from capsim.physics.drafter_memory import Drafter
    from capsim.physics.memory import RuntimeReserve

    o = options
    wrong = [
        name
        for name, fine in (
            ("kv_dtype", isinstance(o["kv_dtype"], str)),
            (
                "gpu_memory_utilization",
                isinstance(o["gpu_memory_utilization"], int | float)
                and not isinstance(o["gpu_memory_utilization"], bool),
            ),
            ("max_model_len", _whole_or_none(o["max_model_len"])),
            ("max_num_seqs", _whole_or_none(o["max_num_seqs"])),
            ("max_num_batched_tokens", _whole_or_none(o["max_num_batched_tokens"])),
            ("state_slots_per_sequence", _whole_or_none(o["state_slots_per_sequence"])),
            ("cpu_moe_layers", _whole_or_none(o["cpu_moe_layers"])),
            ("enforce_eager", isinstance(o["enforce_eager"], bool)),
            ("sliding_window_pages", isinstance(o["sliding_window_pages"], bool)),
            ("dense_in_ranks", isinstance(o["dense_in_ranks"], bool)),
            ("state_layout", isinstance(o["state_layout"], str)),
            ("reserve", isinstance(o["reserve"], RuntimeReserve)),
            (
                "default_limits",
                o["default_limits"] is None
                or (
                    isinstance(o["default_limits"], tuple)
                    and len(o["default_limits"]) == 2
                    and all(_whole_or_none(v) and v is not None for v in o["default_limits"])
                ),
            ),
            (
                "sliding_window_pool",
                o["sliding_window_pool"] is None
                or isinstance(o["sliding_window_pool"], SlidingWindowPool),
            ),
            ("drafter", o["drafter"] is None or isinstance(o["drafter"], Drafter)),
        )
        if not fine
    ]
    if wrong:
        name = wrong[0]
        takes = {
            "kv_dtype": "a KV cache dtype name (auto, fp8, ...)",
            "gpu_memory_utilization": "a number in (0, 1]",
            "enforce_eager": "True or False",
            "sliding_window_pages": "True or False",
            "dense_in_ranks": "True or False",
            "state_layout": "'shared' or 'split'",
            "reserve": "a RuntimeReserve",
            "default_limits": "None or (max_num_batched_tokens, max_num_seqs), whole numbers",
            "sliding_window_pool": "None or an engine's SlidingWindowPool",
            "drafter": "None or a Drafter (physics.drafter_memory.drafter_for)",
        }.get(name, "a whole number, or None")
        require(o[name], (), name, takes)  # raises, with the value described
