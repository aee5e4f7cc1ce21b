"""Entry point of ``python -m solo.train``."""

import sys

from solo.train.cli import main

sys.exit(main())
