"""Pruning on the ONNX graph: channels removed physically, weights zeroed, or the 2:4 pattern.

``prune(model, method=..., sparsity=...)`` gives a pruned copy and a report (sizes, MACs, the
channel groups cut and those kept, with the node that pins them). ``macs(model)`` counts a model's
multiply-accumulates; ``check_2_4(model)`` names the weights that break the 2:4 pattern;
``channel_groups(model)`` shows which tensors must lose channels together.
"""

from __future__ import annotations

from ferry.optimizer.prune._groups import ChannelGroup, channel_groups
from ferry.optimizer.prune._macs import macs
from ferry.optimizer.prune._prune import CRITERIA, METHODS, prune, verify_pruned
from ferry.optimizer.prune._report import PruneReport, PruneResult, Sizes
from ferry.optimizer.prune._sparse import check_2_4

__all__ = [
    "CRITERIA",
    "METHODS",
    "ChannelGroup",
    "PruneReport",
    "PruneResult",
    "Sizes",
    "channel_groups",
    "check_2_4",
    "macs",
    "prune",
    "verify_pruned",
]
