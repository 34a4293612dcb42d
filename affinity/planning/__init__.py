"""Pure planning: settings as immutable values, the rules of each OpenMP runtime (one package per runtime, ``intel/`` first) and their view of the machine, plan()/plan_env() with the registry of runtimes, translations to environments and launch lists, node shares for ranks and instances.

See ``docs/architecture.md`` for what this layer may import."""
