"""A simulated "Acme NPU" adapter for ferry, discovered through the ``ferry.backends`` entry point."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np
import onnx_ir as ir

from ferry.backends import BackendBase, CompileSpec, DeviceInfo, OpRule, OptionSpec

__all__ = ["AcmeNpuBackend", "AcmeNpuPartition"]

#: What the "NPU" stores as its compiled form: a header, then the partition's ONNX bytes.
MAGIC = b"ACME-NPU-1\n"

_F32 = frozenset({"float32"})


class AcmeNpuPartition:
    """One partition "on the NPU" (ONNX Runtime on ``cores`` CPU threads stands in for the chip)."""

    def __init__(self, model_bytes: bytes, cores: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = cores
        self._bytes = model_bytes
        self._session = ort.InferenceSession(
            model_bytes, options, providers=["CPUExecutionProvider"]
        )
        self._outputs = [o.name for o in self._session.get_outputs()]

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs is not None else self._outputs
        return dict(zip(names, self._session.run(names, inputs)))

    def serialize(self) -> bytes:
        return MAGIC + self._bytes


class AcmeNpuBackend(BackendBase):
    """The adapter, thin on ferry's base: the lifecycle's steps it fills in, in order.

    ``devices()`` (the chip and its properties) -> ``options`` (its context: ``cores``, which
    ferry validates) -> capability (``rules()``, then the SDK's ``validate`` veto) ->
    ``compile`` -> ``serialize()`` into ferry's engine cache -> ``load`` -> ``run``. Everything
    else is ``BackendBase``'s default (the registry refuses adapters not on it). Its engine is
    no Python module ferry imports, so it says its own version, availability and install hint.
    """

    name = "acme_npu"
    device = "npu"
    precisions: tuple[str, ...] = ("fp32",)
    install_hint = "pip install ferry-acme-npu"
    #: It only imitates an NPU (on ONNX Runtime's CPU kernels): ``backends="auto"`` never picks it;
    #: it runs where it is named, ``backends="acme_npu"``.
    simulated = True
    #: Its context's options (besides ``threads`` and ``precision``): ferry refuses an unknown
    #: key, a value of another type or one not among the choices, naming it, before compiling.
    options: Mapping[str, OptionSpec] = MappingProxyType(
        {"cores": OptionSpec("cores", int, 1, (1, 2, 4), "NPU cores a partition runs on")}
    )
    #: A partition with symbolic dims compiles once and runs at every size.
    dynamic_shapes = True

    @property
    def version(self) -> str:
        return "0.1.0"

    def available(self) -> bool:
        return True

    def devices(self) -> list[DeviceInfo]:
        """The one (simulated) chip, with what its SDK would report."""
        properties = {"name": "Acme NPU (simulated)", "cores": "4", "memory": "512 MiB"}
        return [DeviceInfo("npu:0", "npu", properties)]

    def rules(self) -> Sequence[OpRule]:
        return [
            OpRule("Conv", dtypes={0: _F32}, const_inputs=(1, 2), max_rank=4),
            OpRule("Relu", dtypes={0: _F32}, max_rank=4),
            OpRule("MaxPool", dtypes={0: _F32}, max_rank=4),
            OpRule("Add", dtypes={0: _F32, 1: _F32}, max_rank=4),
            OpRule("Gemm", dtypes={0: _F32}, const_inputs=(1, 2)),
            OpRule("Flatten", dtypes={0: _F32}, max_rank=4),
        ]

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        by_name = {node.name: node for node in model.graph}
        rejected = {}
        for name in nodes:
            node = by_name.get(name)
            if node is None or node.op_type != "Conv":
                continue
            group = node.attributes.get("group")
            if group is not None and group.as_int() > 1:
                rejected[name] = "Acme NPU SDK: grouped (depthwise) convolution is not supported"
        return rejected

    def compile(self, spec: CompileSpec) -> AcmeNpuPartition:
        return AcmeNpuPartition(ir.to_proto(spec.model).SerializeToString(), _cores(spec))

    def load(self, blob: bytes, spec: CompileSpec) -> AcmeNpuPartition:
        if not blob.startswith(MAGIC):
            raise ValueError("not an Acme NPU engine")
        return AcmeNpuPartition(blob[len(MAGIC) :], _cores(spec))


def _cores(spec: CompileSpec) -> int:
    """The ``cores`` option (already checked by ferry against ``options``), else its default."""
    return int(spec.options.get("cores", AcmeNpuBackend.options["cores"].default))
