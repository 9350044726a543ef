"""Benchmark scripts (issue 6): matmul peak, training throughput and MFU, decoding speed.

Run them as scripts from the repository root (see bench/README.md); they are not tests.
"""
