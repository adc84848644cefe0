"""ferry's IREE backend: partitions compiled by IREE for the llvm-cpu target and run on its
local-task runtime; registered as ``iree`` through the ``ferry.backends`` entry point.

    import ferry
    session = ferry.load("model.onnx", backends=["iree", "onnxruntime"])
"""

from __future__ import annotations

from ferry_iree._backend import OPTIONS, IreeBackend
from ferry_iree._blob import Engine
from ferry_iree._partition import IreePartition

__all__ = ["OPTIONS", "Engine", "IreeBackend", "IreePartition"]
