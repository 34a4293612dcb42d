"""``python -m affinity``: see :mod:`affinity.cli`."""

import sys

from .cli import main

sys.exit(main())
