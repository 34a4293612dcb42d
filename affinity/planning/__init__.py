"""Pure planning: settings as immutable values, the OpenMP runtime's rules and its view of the machine, plan()/plan_env(), translations to environments and launch lists, node shares for ranks and instances.

See ``docs/architecture.md`` for what this layer may import."""
