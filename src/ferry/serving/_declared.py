"""Serving a model through the tensors its config.pbtxt declares (Triton's ``input``/``output``).

Requests must fit the declared ``dims`` (-1: any size; after the batch dim when the model batches);
an input with a ``reshape`` is reshaped to the model's shape before it runs, and an output with one
is reshaped from the model's shape to its ``dims`` before it is sent. Model metadata and ``/config``
show the declared dims: what clients send and receive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ferry.errors import ExecutionError, InvalidInputError
from ferry.serving._batcher import BatchOutcome
from ferry.serving._codec import InferRequest
from ferry.serving._config import TensorConfig
from ferry.serving._scheduler import ModelVersion

__all__ = ["DeclaredVersion"]


class DeclaredVersion(ModelVersion):
    """A :class:`ModelVersion` whose config declares its tensors (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lead = 1 if self.resolved.max_batch_size > 0 else 0
        self._declared_inputs = {t.name: t for t in self.config.inputs}
        self._declared_outputs = {t.name: t for t in self.config.outputs}
        self._reshaped_outputs = {t.name: t for t in self.config.outputs if t.reshape is not None}

    def prepare(self, request: InferRequest) -> tuple[dict[str, np.ndarray], int]:
        """Check the inputs against their declared dims and reshape those that say so, then
        :meth:`ModelVersion.prepare`.

        Raises:
            InvalidInputError: an input that does not fit its declared dims, and what the base
                class refuses.
        """
        lead = self._lead
        for name, array in list(request.inputs.items()):
            declared = self._declared_inputs.get(name)
            if declared is None:
                continue
            shape = array.shape
            if len(shape) != lead + len(declared.dims) or not all(
                want in (-1, got) for want, got in zip(declared.dims, shape[lead:])
            ):
                raise InvalidInputError(
                    f"input {name!r} of model {self.name!r} has shape {list(shape)}; it takes "
                    f"{self._described(declared)}"
                )
            if declared.reshape is not None:
                try:
                    request.inputs[name] = array.reshape(shape[:lead] + declared.reshape)
                except ValueError:
                    raise InvalidInputError(
                        f"input {name!r} of model {self.name!r}: shape {list(shape)} cannot be "
                        f"reshaped to the model's {list(declared.reshape)}"
                    ) from None
        return super().prepare(request)

    async def infer(
        self,
        feeds: dict[str, np.ndarray],
        outputs: list[str] | None,
        batch: int,
        parameters: Mapping[str, Any] | None = None,
    ) -> BatchOutcome:
        """:meth:`ModelVersion.infer`, then the outputs with a ``reshape`` reshaped to their dims.

        Raises:
            ExecutionError: the engine failed, or an output does not fit its declared dims.
        """
        outcome = await super().infer(feeds, outputs, batch, parameters)
        for name, declared in self._reshaped_outputs.items():
            array = outcome.outputs.get(name)
            if array is None:
                continue
            lead = array.shape[: self._lead]
            try:
                outcome.outputs[name] = array.reshape(lead + declared.dims)
            except ValueError:
                raise ExecutionError(
                    f"model {self.name!r}: output {name!r} of shape {list(array.shape)} cannot be "
                    f"reshaped to its declared dims {list(declared.dims)}"
                ) from None
        return outcome

    def tensor_metadata(self, outputs: bool = False) -> list[dict[str, Any]]:
        """The base class's metadata with the declared dims (what clients send and receive)."""
        rows = super().tensor_metadata(outputs)
        declared = self._declared_outputs if outputs else self._declared_inputs
        for row in rows:
            tensor = declared.get(row["name"])
            if tensor is not None:
                row["shape"] = [-1] * self._lead + list(tensor.dims)
        return rows

    def _described(self, tensor: TensorConfig) -> str:
        dims = ", ".join(map(str, tensor.dims))
        if self._lead:
            limit = self.resolved.max_batch_size
            return f"[batch, {dims}] (-1: any size; the batch up to {limit})"
        return f"[{dims}] (-1: any size)"
