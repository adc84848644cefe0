"""Running an exported ``.tflite`` in LiteRT, as a phone would: XNNPACK, and reference kernels.

Inputs and outputs are exchanged in ONNX's layout whatever the file's IO layout is (``nhwc_io``
transposes them here), so results compare directly with ONNX Runtime's on the source model.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ferry.errors import BackendUnavailableError, ExecutionError, InvalidInputError
from ferry.tflite import inverse

__all__ = ["KERNELS", "LiteRT", "Placement"]

logger = logging.getLogger(__name__)

#: The kernel sets a model is verified with: LiteRT's default (XNNPACK delegate, builtin kernels
#: for what it leaves) and its reference kernels (plain C++, no delegate).
KERNELS = ("xnnpack", "reference")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where LiteRT ran the ops: how many the delegate took, and the others by type."""

    kernels: str
    delegated: int
    total: int
    builtin: dict[str, int]

    def describe(self) -> str:
        if self.kernels == "reference":
            return f"LiteRT reference kernels ({self.total} ops)"
        rest = ", ".join(f"{op} x{n}" for op, n in sorted(self.builtin.items()))
        tail = f"; LiteRT kernels: {rest}" if rest else ""
        return f"XNNPACK delegate: {self.delegated} of {self.total} ops{tail}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class LiteRT:
    """One exported model loaded in LiteRT with one kernel set.

    Raises:
        BackendUnavailableError: ai-edge-litert is not installed.
        ExecutionError: LiteRT refuses the model (a kernel's prepare step failed).
    """

    def __init__(
        self,
        data: bytes,
        kernels: str,
        inputs: Sequence[tuple[str, Sequence[int]]],
        outputs: Sequence[tuple[str, Sequence[int]]],
    ) -> None:
        try:
            from ai_edge_litert.interpreter import Interpreter, OpResolverType
        except ImportError as e:
            raise BackendUnavailableError(
                "verifying a .tflite export needs LiteRT: pip install 'ferry[tflite]' "
                "(or pass verify=False / --no-verify)"
            ) from e
        from ferry.converters._base import native_stderr_to_log

        options: dict[str, Any] = {}
        if kernels == "reference":
            options["experimental_op_resolver_type"] = OpResolverType.BUILTIN_REF
        self.kernels = kernels
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        try:
            with native_stderr_to_log(logger):
                self.interpreter = Interpreter(model_content=data, **options)
                self.interpreter.allocate_tensors()
        except (RuntimeError, ValueError) as e:
            raise ExecutionError(
                f"LiteRT ({kernels} kernels) refuses the exported model: {e}"
            ) from e
        self._in_index = {
            d["name"]: (d["index"], d["dtype"], tuple(int(x) for x in d["shape"]))
            for d in self.interpreter.get_input_details()
        }
        self._out_index = {d["name"]: d["index"] for d in self.interpreter.get_output_details()}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on ONNX-layout ``feeds``; the outputs in ONNX's layout, by name."""
        it = self.interpreter
        for name, perm in self._inputs:
            index, dtype, shape = self._in_index[name]
            if name not in feeds:
                raise InvalidInputError(f"no sample for input {name!r}")
            array = np.asarray(np.asarray(feeds[name]).transpose(perm), order="C")
            if tuple(array.shape) != shape:
                raise InvalidInputError(
                    f"sample {name!r} has shape {list(np.shape(feeds[name]))}; the export takes "
                    f"{[shape[i] for i in inverse(perm)]} (give its sizes with shapes=/--shape)"
                )
            it.set_tensor(index, array.astype(dtype, copy=False))
        try:
            it.invoke()
        except RuntimeError as e:
            raise ExecutionError(
                f"LiteRT ({self.kernels} kernels) failed running the export: {e}"
            ) from e
        return {
            name: np.array(it.get_tensor(self._out_index[name])).transpose(inverse(perm))
            for name, perm in self._outputs
        }

    def placement(self) -> Placement:
        """Which ops the delegate took: each DELEGATE node stands for the ops between its
        inputs and outputs; the rest ran on LiteRT's own kernels."""
        ops = self.interpreter._get_ops_details()
        originals = [d for d in ops if d["op_name"] != "DELEGATE"]
        delegates = [d for d in ops if d["op_name"] == "DELEGATE"]
        if self.kernels == "reference" or not delegates:
            counts = Counter(d["op_name"] for d in originals)
            return Placement(self.kernels, 0, len(originals), dict(counts))
        producer = {int(t): d["index"] for d in originals for t in d["outputs"]}
        by_index = {d["index"]: d for d in originals}
        taken: set[int] = set()
        for node in delegates:
            boundary = {int(t) for t in node["inputs"]}
            stack = [int(t) for t in node["outputs"]]
            while stack:
                t = stack.pop()
                k = producer.get(t)
                if k is None or k in taken or t in boundary:
                    continue
                taken.add(k)
                stack.extend(int(i) for i in by_index[k]["inputs"] if int(i) >= 0)
        left = Counter(d["op_name"] for d in originals if d["index"] not in taken)
        return Placement(self.kernels, len(taken), len(originals), dict(left))
