"""Physics layer: pure functions of parameters, memory, (later) step time."""
