"""``python -m sapiens2``: the same command as the installed ``sapiens2`` (:mod:`sapiens2.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
