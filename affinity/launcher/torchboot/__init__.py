"""The directory ``affinity run`` puts first on ``PYTHONPATH``: its ``sitecustomize``
prepares PyTorch in the Python processes the launcher starts (see
:mod:`affinity.launcher.torch_env`)."""
