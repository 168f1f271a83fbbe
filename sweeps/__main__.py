"""``python -m sweeps``."""

import sys

from sweeps.commands.cli import main

sys.exit(main())
