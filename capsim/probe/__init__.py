"""Probe layer: load generation against real OpenAI-compatible servers, and run files."""
