"""OpenVINO keeps a decoder's cache itself: the stateful model.

OpenVINO's make-stateful transformation turns each past input and the present output that feeds
it into one state variable inside the compiled model (what OpenVINO GenAI runs), so the cache
never leaves the engine: each step reads the state, appends its new slots and writes it back.
The stateful model is compiled once per partition, with the plain model's settings, and each
sequence gets its own infer request with its states emptied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ferry.backends._kv import KVLayout
from ferry.errors import ExecutionError, ModelLoadError

__all__ = ["OpenVINOKVRunner", "stateful_model"]


def stateful_model(core: Any, source: Any, layout: KVLayout, config: Mapping[str, str]) -> Any:
    """``source`` (a model OpenVINO reads) compiled with ``layout``'s pasts and presents made
    state variables."""
    from openvino._offline_transformations import apply_make_stateful_transformation

    try:
        model = core.read_model(source)
        apply_make_stateful_transformation(model, dict(zip(layout.past, layout.present)))
        return core.compile_model(model, "CPU", dict(config))
    except Exception as e:  # OpenVINO raises its own types from C++
        raise ModelLoadError(
            f"OpenVINO could not make the decoder's cache a state: {str(e).splitlines()[0]}"
        ) from e


class OpenVINOKVRunner:
    """A :class:`~ferry.backends.KVRunner` on a stateful compiled model: one sequence's cache
    lives in its infer request's states."""

    in_place = False

    def __init__(self, compiled: Any, layout: KVLayout) -> None:
        import openvino as ov

        self.layout = layout
        self._request = compiled.create_infer_request()
        # A state starts with no batch rows; a sequence starts with its rows and no slots.
        for state in self._request.query_state():
            state.state = ov.Tensor(layout.empty(0))
        self._ports = {
            name: index for index, port in enumerate(compiled.inputs) for name in port.get_names()
        }
        self._logits = next(
            index
            for index, port in enumerate(compiled.outputs)
            if layout.logits in port.get_names()
        )
        self._tensor = ov.Tensor

    def run(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        request = self._request
        try:
            for name, value in feeds.items():
                port = self._ports.get(name)
                if port is not None:
                    request.set_input_tensor(port, self._tensor(np.ascontiguousarray(value)))
            request.infer()
        except Exception as e:
            raise ExecutionError(
                f"OpenVINO failed to run the decoder: {str(e).splitlines()[0]}"
            ) from e
        logits: np.ndarray = request.get_output_tensor(self._logits).data.copy()
        return logits
