"""The rules of Intel's OpenMP runtime (libiomp5): its settings syntax, its view of the
machine and its affinity steps."""
