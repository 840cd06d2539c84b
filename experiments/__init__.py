"""Experiment scripts (run them through experiments/run.py); a package so tests can import them."""
