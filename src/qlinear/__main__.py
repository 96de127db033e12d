"""``python -m qlinear``: the qlinear command."""

import sys

from .cli import main

sys.exit(main())
