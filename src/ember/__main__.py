"""``python -m ember``: the ``ember`` command (see :mod:`ember.cli`)."""

import sys

from ember.cli import main

if __name__ == "__main__":
    sys.exit(main())
