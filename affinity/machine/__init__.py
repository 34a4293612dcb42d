"""The machine: Topology values and their sources, the one module that touches the compiled core, cgroup limits.

See ``docs/architecture.md`` for what this layer may import."""
