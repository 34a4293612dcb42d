"""Benchmarks (pytest-benchmark).  Each file compares affinity with what a user
would otherwise use, side by side in one run; ``make bench`` writes the ratios
to ``bench/RESULTS.md``."""
