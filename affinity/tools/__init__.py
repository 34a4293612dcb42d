"""The faces: the command line, the main job (demo), pictures, the TensorFlow workload.

See ``docs/architecture.md`` for what this layer may import."""
