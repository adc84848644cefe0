"""``python -m ferry.conformance``: see ``ferry.conformance._cli``."""

import sys

from ferry.conformance._cli import main

sys.exit(main())
