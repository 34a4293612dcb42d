"""Differential testing of the planner against the real OpenMP runtimes.

See ``oracle/README.md``.  Not part of the installed package.
"""
