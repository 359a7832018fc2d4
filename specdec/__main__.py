"""python -m specdec: the command line (specdec.apps.cli)."""

import sys

from .apps.cli import main

sys.exit(main())
