"""Benchmarks: `python -m bench [suite ...]` prints tables and writes docs/benchmarks.md (+ PNG plots)."""
