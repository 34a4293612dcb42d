"""Side effects on processes we start: ``affinity run``, instances, ranks, the pthread preload's Python side.

See ``docs/architecture.md`` for what this layer may import."""
