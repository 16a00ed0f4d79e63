"""Calibration: time the real backend over step shapes, fit the simulator's step-latency profile."""
