"""Planner layer: search hardware and serving configurations with the engine, rank them."""
