"""Side effects in this process: thread masks, memory policy, OpenMP teams, TensorFlow pools, apply()/pinned() with restore, the bind map.

See ``docs/architecture.md`` for what this layer may import."""
