"""Benchmarks: the gateway against a direct upstream, a bare relay and a lean floor (see README)."""
