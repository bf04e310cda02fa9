"""Benchmarks (never run as tests): `python -m bench.passthrough --help`."""
