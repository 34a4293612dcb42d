"""``python -m affinity``: see :mod:`affinity.tools.cli`."""

import sys

from .tools.cli import main

sys.exit(main())
