"""Measuring: the benchmark client, the block-reuse probe, measure(server, run) -> record, engine
supply, locks, the sweep loop and its executors.
"""
