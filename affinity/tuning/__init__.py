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
  line and an ``affinity.apply`` call;
* :mod:`~affinity.tuning.metric`, :mod:`~affinity.tuning.runner`,
  :mod:`~affinity.tuning.report`, :mod:`~affinity.tuning.cli`: ``affinity tune``.

Nothing is imported here: optuna loads only when a tuner is used.
"""
