"""The lowering's tests build their graphs with the TFLite export's helpers (``tests/mobile``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "mobile"))
