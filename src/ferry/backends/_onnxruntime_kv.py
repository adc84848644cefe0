"""ONNX Runtime keeps a decoder's cache itself, through I/O binding.

In place (a graph whose past feeds ``GroupQueryAttention``): one zeroed buffer per cache tensor,
``capacity`` slots wide, bound as both the past input and the present output, so every step
writes its new slots into the buffer the next step reads; nothing is allocated or copied per
token. Otherwise each step's presents stay ONNX Runtime's ``OrtValue``\\ s and are bound as the
next step's pasts, with no copy through numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ferry.backends._kv import KVLayout
from ferry.errors import ExecutionError

__all__ = ["OrtKVRunner", "run_prompt"]


class OrtKVRunner:
    """A :class:`~ferry.backends.KVRunner` on an ``onnxruntime.InferenceSession``."""

    def __init__(self, session: Any, layout: KVLayout, error_message: Any) -> None:
        import onnxruntime as ort

        self._session = session
        self.layout = layout
        self._message = error_message
        # GroupQueryAttention takes a batch's prompt only without a past ("batch_size must be 1
        # when sequence_length > 1 and past context is given"), so batches grow their cache.
        self.in_place = layout.in_place and layout.batch == 1
        self._binding = session.io_binding()
        slots = layout.capacity if self.in_place else 0
        # Keep the numpy buffers alive: the OrtValues borrow their memory.
        self._buffers = [layout.empty(slots) for _ in layout.past]
        for past, present, buffer in zip(layout.past, layout.present, self._buffers):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            self._binding.bind_ortvalue_input(past, value)
            if self.in_place:
                self._binding.bind_ortvalue_output(present, value)
            else:
                self._binding.bind_output(present)
        self._binding.bind_output(layout.logits)
        # get_outputs() lists the outputs in the order they were first bound.
        self._logits_index = len(layout.present)
        # In place, the logits are the one output read back: written straight into an array of
        # ours (get_outputs() wraps every bound output, ~1 ms a step for 60 cache tensors).
        self._ortvalue = ort.OrtValue.ortvalue_from_numpy
        self._vocab = _static_vocab(session, layout.logits) if self.in_place else None
        self._used = 0  # slots written so far
        self._defaults = {value.name for value in session.get_overridable_initializers()}

    def run(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        new = int(feeds["input_ids"].shape[1])
        # The prompt as a plain run: in place, attending over all `capacity` slots of an empty
        # buffer made a 128-token prefill 1.6x slower (547 against 340 ms, capacity 384); and a
        # plain run honours logits_to_keep, which I/O binding cannot bind.
        prompt = self._used == 0 and new > 1
        logits = self._prefill(feeds, new) if prompt else self._step(feeds)
        self._used += new
        return logits

    def _prefill(self, feeds: Mapping[str, np.ndarray], new: int) -> np.ndarray:
        """The first chunk run with empty pasts; its presents copied into the buffers (in
        place) or bound as the next step's pasts."""
        outputs = run_prompt(self._session, self.layout, feeds, new, self._message)
        if self.in_place:
            for buffer, present in zip(self._buffers, outputs[1:]):
                buffer[:, :, :new] = present
        else:
            # Bound by address: the arrays are kept alive until the next step replaces them.
            self._buffers = list(outputs[1:])
            for past, present in zip(self.layout.past, self._buffers):
                self._binding.bind_cpu_input(past, present)
        logits: np.ndarray = outputs[0]
        return logits

    def _step(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        binding = self._binding
        for name, array in feeds.items():
            if name in self._defaults:
                # I/O binding takes only true inputs, not initializers a run may override
                # (logits_to_keep): a bound step gives every position's logits.
                continue
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        mine = None
        if self._vocab is not None:
            rows, new = feeds["input_ids"].shape
            mine = np.empty((rows, new, self._vocab), dtype=np.float32)
            binding.bind_ortvalue_output(self.layout.logits, self._ortvalue(mine))
        try:
            self._session.run_with_iobinding(binding)
        except Exception as e:  # ORT raises its own exception types from C++
            raise ExecutionError(
                f"onnxruntime failed to run the decoder: {self._message(e)}"
            ) from e
        if mine is not None:
            return mine
        outputs = binding.get_outputs()
        if not self.in_place:
            # This step's presents become the next step's pasts; the presents are unbound so
            # that ONNX Runtime allocates the next ones (one slot longer).
            for index, (past, present) in enumerate(zip(self.layout.past, self.layout.present)):
                binding.bind_ortvalue_input(past, outputs[index])
                binding.bind_output(present)
        logits: np.ndarray = outputs[self._logits_index].numpy()
        binding.bind_output(self.layout.logits)  # its width changes from the prompt to a token
        return logits


def run_prompt(
    session: Any, layout: KVLayout, feeds: Mapping[str, np.ndarray], new: int, message: Any
) -> list[np.ndarray]:
    """A sequence's first ``new`` tokens as a plain run with empty pasts (the mask cut to
    them): the logits, then the presents in ``layout.present``'s order."""
    plain = dict(feeds)
    plain["attention_mask"] = feeds["attention_mask"][:, :new]
    plain.update(dict.fromkeys(layout.past, layout.empty(0)))
    try:
        outputs: list[np.ndarray] = session.run([layout.logits, *layout.present], plain)
    except Exception as e:  # ORT raises its own exception types from C++
        raise ExecutionError(f"onnxruntime failed to run the decoder: {message(e)}") from e
    return outputs


def _static_vocab(session: Any, logits: str) -> int | None:
    """The logits' last dim when the graph fixes it and they are float32, else None."""
    for output in session.get_outputs():
        if output.name == logits and output.type == "tensor(float)":
            last = output.shape[-1] if output.shape else None
            return last if isinstance(last, int) else None
    return None
