"""A compiled partition: IREE's vmfb called on named inputs, its results named.

IREE's entry function takes the partition's inputs and returns its outputs positionally, in
the ONNX graph's order; the header kept with the vmfb (:class:`~ferry_iree._blob.Engine`) names
them. ``run`` may be called from several threads at once (each call borrows its own VM context).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ferry.errors import ExecutionError, InvalidInputError
from ferry_iree._blob import Engine, pack
from ferry_iree._runtime import ContextPool

__all__ = ["IreePartition"]


class IreePartition:
    """One partition compiled by IREE for the llvm-cpu target, on the local-task runtime."""

    def __init__(self, engine: Engine, *, threads: int | None = None) -> None:
        self.engine = engine
        self.input_names = list(engine.inputs)
        self.output_names = list(engine.outputs)
        self._dtypes = [np.dtype(d) if d else None for d in engine.dtypes] or [None] * len(
            self.output_names
        )
        self._pool = ContextPool(engine.vmfb, engine.entry, threads)

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run on ``inputs`` (by name); the requested ``outputs`` (all when None) by name.

        Raises:
            InvalidInputError: an input is missing or an output is not the partition's.
            ExecutionError: IREE refused the inputs (a shape the module was not compiled for)
                or failed while running.
        """
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise InvalidInputError(
                f"iree: missing input(s) {', '.join(map(repr, missing))}; the partition takes "
                f"{', '.join(self.input_names)}"
            )
        wanted = self.output_names if outputs is None else list(outputs)
        unknown = [name for name in wanted if name not in self.output_names]
        if unknown:
            raise InvalidInputError(
                f"iree: unknown output(s) {', '.join(map(repr, unknown))}; the partition gives "
                f"{', '.join(self.output_names)}"
            )
        # Not np.ascontiguousarray: it makes a scalar (0-d) input 1-d, which IREE refuses.
        args = [np.require(inputs[name], requirements="C") for name in self.input_names]
        try:
            with self._pool.function() as function:
                results = function(*args)
                if not isinstance(results, (tuple, list)):
                    results = (results,)
                arrays = [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
        except (ValueError, RuntimeError, TypeError, IndexError) as e:  # IREE's, on a bad call
            first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
            shapes = ", ".join(
                f"{n} {a.dtype}{list(a.shape)}" for n, a in zip(self.input_names, args)
            )
            raise ExecutionError(f"iree: the module refused inputs ({shapes}): {first}") from e
        named = dict(zip(self.output_names, map(self._as_declared, arrays, self._dtypes)))
        return {name: named[name] for name in wanted}

    @staticmethod
    def _as_declared(array: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
        """``array`` in the dtype the model declares: IREE's signless integers come back
        signed (uint8 as int8), read again as the same bits; anything else converted."""
        if dtype is None or array.dtype == dtype:
            return array
        if array.dtype.kind in "iu" and dtype.kind in "iu" and array.itemsize == dtype.itemsize:
            return array.view(dtype)
        return array.astype(dtype)

    def serialize(self) -> bytes:
        """The vmfb with the header that names its inputs and outputs."""
        return pack(self.engine)
