"""``python -m affinity``: see :mod:`affinity.tools.cli`.

``python -m affinity run ...`` first tries the launch remembered for the same
inputs (:mod:`affinity.launcher.fastpath`): when there is one, the command is
executed before the command line is even parsed."""

import sys

if sys.argv[1:2] == ["run"]:
    from .launcher.fastpath import start  # lazy: affinity run's start-up imports nothing else

    start(sys.argv[2:])  # no return when the launch is remembered

from .tools.cli import main  # noqa: E402

sys.exit(main())
