"""``python -m affinity`` and the ``affinity`` script: see :mod:`affinity.tools.cli`.

A Ctrl-C at any point after this module starts -- while the command's modules are
imported, the command line parsed, the command run -- ends with ``affinity CMD:
interrupted`` and status 130 (it was a ``KeyboardInterrupt`` traceback from an import
and status -2 in the first 0.35 s).  What it cannot cover: a Ctrl-C before Python
runs this module (the interpreter's start-up, ``import affinity``: about 0.4 ms).
"""

import sys


def entry() -> None:
    """Run the command line of ``sys.argv``; exit with its status."""
    status = 130
    try:
        from .tools.cli import main  # lazy: imported inside the Ctrl-C guard

        status = main()
    except KeyboardInterrupt:
        command = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].isidentifier() else ""
        sys.stderr.write(f"affinity{' ' + command if command else ''}: interrupted\n")
    sys.exit(status)


if __name__ == "__main__":
    entry()
