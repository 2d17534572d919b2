"""Benchmarks: the transports table and the relay-overhead comparison."""
