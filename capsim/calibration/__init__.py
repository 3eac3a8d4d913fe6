"""Calibration layer: published measurements as data, comparison with predictions."""
