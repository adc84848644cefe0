"""Running models: the Plan (which backend runs what) and the Session that executes it."""

from __future__ import annotations

from ferry.runtime.plan import Partition, Plan
from ferry.runtime.session import Session, load
from ferry.runtime.specs import TensorSpec

__all__ = ["Partition", "Plan", "Session", "TensorSpec", "load"]
