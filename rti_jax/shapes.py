"""Padded shapes for jitted functions (``models/shapes.py``, where the sampler and the scorer use
them; re-exported for the trainer and the benchmarks)."""

from models.shapes import UPDATE_BUCKETS, bucket_length, bucket_rows  # noqa: F401
