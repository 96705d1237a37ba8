"""Benchmarks for offload (kept out of the default test run; `make test` runs them once in smoke mode)."""
