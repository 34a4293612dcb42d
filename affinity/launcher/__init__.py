"""Side effects on processes we start: ``affinity run``, instances, ranks, the pthread preload's Python side.

``run`` is the command; ``options`` (the command line), ``build`` (the pure plan of
a launch), ``execute`` (putting it into effect), ``numactl`` (its reports) and
``preload`` (``--pin-threads``) do its work.

See ``docs/architecture.md`` for what this layer may import."""
