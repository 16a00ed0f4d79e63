"""Shipped step-latency profiles (JSON), found with ``importlib.resources``."""
