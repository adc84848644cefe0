"""Two streaming models with recurrent state, exported from PyTorch: what sequence batching serves.

Each call takes one chunk of a stream and the state the previous call returned, named the way
ferry names recurrent state (:mod:`ferry._state_names`): inputs ``audio`` and ``state:<v>``,
outputs ``prob`` and ``state_out:<v>``, every tensor with a leading ``batch`` dim.

* ``keyword_spotter``: microWakeWord's interface (3 new 40-band feature frames per call, as the
  kit's ``wakeword_int8``): a GRU cell run over the frames, ``state:h`` [batch, 64], and the
  wake-word probability [batch, 1].
* ``voice_activity``: Silero-VAD's shape of model: 10 ms of 16 kHz samples [batch, 160] through a
  strided Conv1d front end into an LSTM cell (``state:h``, ``state:c`` [batch, 32]), and the
  speech probability [batch, 1].

Their weights are seeded, not trained: the tests need a real recurrent graph (MatMul, gates,
Sigmoid/Tanh, state fed back) with deterministic values, not its accuracy.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

__all__ = ["STREAMING_MODELS", "streaming_inputs", "streaming_model"]

#: name -> (the chunk's shape after the batch dim, state name -> its size after the batch dim).
STREAMING_MODELS: dict[str, tuple[tuple[int, ...], dict[str, int]]] = {
    "keyword_spotter": ((3, 40), {"h": 64}),
    "voice_activity": ((160,), {"h": 32, "c": 32}),
}


def _modules() -> dict[str, Any]:
    import torch
    from torch import nn

    class KeywordSpotter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = nn.GRUCell(40, 64)
            self.head = nn.Linear(64, 1)

        def forward(self, audio: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
            for frame in range(audio.shape[1]):
                h = self.cell(audio[:, frame], h)
            return torch.sigmoid(self.head(h)), h

    class VoiceActivity(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.front = nn.Conv1d(1, 16, kernel_size=20, stride=10)
            self.cell = nn.LSTMCell(16 * 15, 32)
            self.head = nn.Linear(32, 1)

        def forward(
            self, audio: torch.Tensor, h: torch.Tensor, c: torch.Tensor
        ) -> tuple[torch.Tensor, ...]:
            features = torch.relu(self.front(audio.unsqueeze(1))).flatten(1)
            h, c = self.cell(features, (h, c))
            return torch.sigmoid(self.head(h)), h, c

    return {"keyword_spotter": KeywordSpotter, "voice_activity": VoiceActivity}


def streaming_model(name: str, *, seed: int = 0) -> ir.Model:
    """Export one of :data:`STREAMING_MODELS` to ONNX (about a second or two).

    Args:
        name: ``keyword_spotter`` or ``voice_activity``.
        seed: seeds the weights.

    Raises:
        KeyError: an unknown name.
    """
    import torch

    from ferry.converters import silence_exporter_logs

    chunk, states = STREAMING_MODELS[name]
    torch.manual_seed(seed)
    module = _modules()[name]().eval()
    example = (torch.zeros(2, *chunk), *(torch.zeros(2, size) for size in states.values()))
    batch = torch.export.Dim("batch", min=1, max=1024)
    with silence_exporter_logs():
        program = torch.onnx.export(
            module,
            example,
            dynamo=True,
            input_names=["audio", *(f"state:{v}" for v in states)],
            output_names=["prob", *(f"state_out:{v}" for v in states)],
            dynamic_shapes=tuple({0: batch} for _ in example),
            opset_version=18,
            optimize=True,
            verbose=False,
        )
    if program is None:
        raise RuntimeError(f"torch.onnx.export returned no program for {name!r}")
    return program.model


def streaming_inputs(name: str, chunks: int, *, seed: int = 0) -> list[Any]:
    """``chunks`` chunks of one stream (batch 1, float32): features or samples in [-1, 1)."""
    import numpy as np

    shape = STREAMING_MODELS[name][0]
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=(1, *shape)).astype(np.float32) for _ in range(chunks)]
