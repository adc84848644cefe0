"""The TFLite subgraph being written: tensors, operators, deduplicated constants, unique names.

Plain data only (the dataclasses of :mod:`ferry.tflite`); :func:`ferry.tflite.write_tflite`
turns the finished :class:`~ferry.tflite.TFLiteModel` into bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ferry.tflite._schema import (
    TFLITE_DTYPES,
    TFLITE_INT4,
    TFLiteModel,
    TFLiteOperator,
    TFLiteQuant,
    TFLiteSubgraph,
    TFLiteTensor,
)

__all__ = ["FLOAT16", "FLOAT32", "INT8", "INT32", "INT64", "Builder", "tflite_type"]

FLOAT32, FLOAT16, INT32, INT64, BOOL, INT8 = 0, 1, 2, 4, 6, 9

_CODES = {dtype: code for code, dtype in TFLITE_DTYPES.items() if code != TFLITE_INT4}


def tflite_type(dtype: np.dtype[Any]) -> int | None:
    """The TFLite TensorType code of a numpy dtype, or None when TFLite has none."""
    return _CODES.get(np.dtype(dtype))


class Builder:
    """One TFLite subgraph under construction."""

    def __init__(self) -> None:
        self.tensors: list[TFLiteTensor] = []
        self.operators: list[TFLiteOperator] = []
        self._names: set[str] = set()
        self._consts: dict[tuple[Any, ...], int] = {}

    # ------------------------------------------------------------------------------- tensors

    def unique(self, name: str) -> str:
        """``name``, or ``name_1``, ``name_2``... when taken."""
        candidate, n = name or "t", 0
        while candidate in self._names:
            n += 1
            candidate = f"{name}_{n}"
        self._names.add(candidate)
        return candidate

    def tensor(
        self,
        name: str,
        ttype: int,
        shape: Sequence[int],
        *,
        data: np.ndarray | None = None,
        quant: TFLiteQuant | None = None,
        is_variable: bool = False,
    ) -> int:
        """A new tensor; its index."""
        index = len(self.tensors)
        self.tensors.append(
            TFLiteTensor(
                index=index,
                name=self.unique(name),
                type=ttype,
                shape=tuple(int(d) for d in shape),
                signature=None,
                data=data,
                quant=quant,
                is_variable=is_variable,
                sparsity=None,
            )
        )
        return index

    def const(
        self,
        array: np.ndarray,
        name: str,
        *,
        ttype: int | None = None,
        quant: TFLiteQuant | None = None,
    ) -> int:
        """A constant tensor holding ``array`` (the same values, type and quantization give the
        same tensor)."""
        array = np.asarray(array, order="C")
        code = tflite_type(array.dtype) if ttype is None else ttype
        if code is None:
            raise TypeError(f"TFLite has no tensor type for {array.dtype}")
        key: tuple[Any, ...] = (
            code,
            array.shape,
            hashlib.sha1(array.tobytes()).hexdigest(),
            None
            if quant is None
            else (quant.scale.tobytes(), quant.zero_point.tobytes(), quant.axis),
        )
        found = self._consts.get(key)
        if found is not None:
            return found
        index = self.tensor(name, code, array.shape, data=array, quant=quant)
        self._consts[key] = index
        return index

    def rename(self, index: int, name: str) -> None:
        """Give tensor ``index`` the name ``name``; a tensor already called so is renamed."""
        tensor = self.tensors[index]
        if tensor.name == name:
            return
        for other in self.tensors:
            if other.name == name:
                other.name = self.unique(f"{name}/inner")
                break
        self._names.discard(tensor.name)
        self._names.add(name)
        tensor.name = name

    def is_const(self, index: int) -> bool:
        return self.tensors[index].data is not None

    # ----------------------------------------------------------------------------- operators

    def op(
        self,
        opcode: str,
        inputs: Sequence[int],
        outputs: Sequence[int],
        options: Mapping[str, Any] | None = None,
    ) -> TFLiteOperator:
        """Append an operator (version 0: the writer picks the version its features need)."""
        op = TFLiteOperator(
            index=len(self.operators),
            opcode=opcode,
            custom_code=None,
            version=0,
            inputs=tuple(int(i) for i in inputs),
            outputs=tuple(int(o) for o in outputs),
            options=dict(options or {}),
            custom_options=None,
        )
        self.operators.append(op)
        return op

    # ---------------------------------------------------------------------------------- done

    def model(self, inputs: Sequence[int], outputs: Sequence[int], description: str) -> TFLiteModel:
        """The finished model: operators renumbered, tensors nobody reads or writes dropped."""
        used = {*inputs, *outputs}
        for op in self.operators:
            used.update(i for i in op.inputs if i >= 0)
            used.update(op.outputs)
        order = sorted(used)
        renumber = {old: new for new, old in enumerate(order)}
        tensors = []
        for old in order:
            t = self.tensors[old]
            t.index = renumber[old]
            tensors.append(t)
        operators = []
        for k, op in enumerate(self.operators):
            op.index = k
            op.inputs = tuple(renumber[i] if i >= 0 else -1 for i in op.inputs)
            op.outputs = tuple(renumber[o] for o in op.outputs)
            operators.append(op)
        subgraph = TFLiteSubgraph(
            index=0,
            name="main",
            tensors=tensors,
            inputs=tuple(renumber[i] for i in inputs),
            outputs=tuple(renumber[o] for o in outputs),
            operators=operators,
        )
        return TFLiteModel(version=3, description=description, subgraphs=[subgraph])
