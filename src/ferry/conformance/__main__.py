"""``python -m ferry.conformance --backend NAME --out docs/conformance/``: see ``ferry.conformance``."""

import sys

from ferry.conformance._run import main

sys.exit(main())
