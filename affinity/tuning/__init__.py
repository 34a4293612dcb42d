"""Searching settings: the tuner behind ``affinity.tune()`` and ``affinity tune -- CMD``.

* :mod:`~affinity.tuning.space`: the space (parameter name -> choices), checked, and
  the default space of a machine;
* :mod:`~affinity.tuning.priors`: what the machine says about a configuration (the
  seeds' rules as first candidates, a prior score, which configurations place
  threads and memory the same way);
* :mod:`~affinity.tuning.sampler`: an optuna sampler that uses them;
* :mod:`~affinity.tuning.search`: :func:`~affinity.tuning.search.tune` and
  :class:`~affinity.tuning.search.TuneResult`;
* :mod:`~affinity.tuning.forms`: a configuration as an environment, an ``affinity run``
  line and an ``affinity.apply`` call.

The ``affinity tune -- CMD`` command (running the command, reading its metric, the
table and the plot) is a face of the library: ``affinity/tools/tune_*.py``.  Nothing
here prints; progress goes to a callback or the ``affinity.tuning`` logger.

Nothing is imported here: optuna loads only when a tuner is used.
"""
