"""PyTorch definitions of the zoo models, their deterministic weights and digits training.

Everything here imports torch, so only :mod:`ferry.zoo._build` (itself imported lazily) and tests
import this module.

Determinism: weights come from ``torch.manual_seed(0)`` inside :func:`torch.random.fork_rng`, so
the caller's global RNG state is left untouched, and the digits models are trained with a
private, seeded :class:`torch.Generator` for shuffling. CPU training is bitwise reproducible for a
given machine and torch thread count; a different thread count changes float summation order and
so gives slightly different (equally accurate) trained weights. The untrained models do not depend
on the thread count. The resulting state dicts are cached per process so ``build`` never retrains.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F

from ferry.zoo._data import _digits_split
from ferry.zoo._specs import get_spec

logger = logging.getLogger(__name__)

SEED = 0


@contextmanager
def _seeded(seed: int = SEED) -> Iterator[None]:
    """Seeds torch's global CPU RNG for the block, restoring the caller's RNG state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# --------------------------------------------------------------------------------------------
# Architectures
# --------------------------------------------------------------------------------------------


class DigitsCNN(nn.Module):
    """Conv-BN-ReLU x2, max-pool, linear head for 1x8x8 digit images."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class MLP(nn.Module):
    """64 -> 128 -> 64 -> 10 ReLU MLP for flattened digit images."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(64, 128),
            nn.ReLU(),
            nn.Linear(128, 64),
            nn.ReLU(),
            nn.Linear(64, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _conv_bn_act(
    in_ch: int,
    out_ch: int,
    kernel: int,
    stride: int = 1,
    groups: int = 1,
    act: Callable[[], nn.Module] | None = None,
) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_ch),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, linear 1x1 project, optional residual."""

    def __init__(
        self, in_ch: int, out_ch: int, stride: int, expand: int, act: Callable[[], nn.Module]
    ) -> None:
        super().__init__()
        hidden = in_ch * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn_act(in_ch, hidden, 1, act=act))
        layers += [
            _conv_bn_act(hidden, hidden, 3, stride=stride, groups=hidden, act=act),
            # The projection is linear (no activation), as in the paper.
            _conv_bn_act(hidden, out_ch, 1),
        ]
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_residual else y


class MobileNetV2(nn.Module):
    """A small MobileNetV2-style classifier for 3x32x32 inputs (~0.1M parameters).

    Early blocks use ReLU6 (as MobileNetV2), later blocks and the head use Hardswish (as
    MobileNetV3), so the graph exercises both activations.
    """

    # (out_channels, stride, expand ratio, use hardswish)
    _BLOCKS = (
        (16, 1, 1, False),
        (24, 2, 4, False),
        (24, 1, 4, False),
        (32, 2, 4, True),
        (32, 1, 4, True),
        (64, 2, 4, True),
        (64, 1, 4, True),
    )

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_act(3, 16, 3, stride=2, act=nn.Hardswish)]
        in_ch = 16
        for out_ch, stride, expand, hswish in self._BLOCKS:
            act = nn.Hardswish if hswish else nn.ReLU6
            layers.append(InvertedResidual(in_ch, out_ch, stride, expand, act))
            in_ch = out_ch
        layers.append(_conv_bn_act(in_ch, 256, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(256, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class TransformerBlock(nn.Module):
    """One pre-norm transformer encoder block with explicit attention math.

    Written out by hand rather than with ``nn.TransformerEncoderLayer`` / SDPA so the exported
    graph is plain MatMul / Softmax / LayerNormalization / Gelu (or Erf) without fused-kernel
    fallbacks. The sequence length is fixed so reshapes use constant shapes (no Shape ops).
    """

    def __init__(
        self, d_model: int = 64, num_heads: int = 4, d_ff: int = 256, seq_len: int = 16
    ) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.seq_len = seq_len
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.ln1 = nn.LayerNorm(d_model)
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU(approximate="none")
        self.ff2 = nn.Linear(d_ff, d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # [B, S, D] -> [B, H, S, Dh]; -1 for the batch keeps the reshape target constant.
        return x.reshape(-1, self.seq_len, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        q = self._heads(self.q_proj(h))
        k = self._heads(self.k_proj(h))
        v = self._heads(self.v_proj(h))
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        attn = torch.matmul(torch.softmax(scores, dim=-1), v)
        attn = attn.transpose(1, 2).reshape(-1, self.seq_len, self.d_model)
        x = x + self.out_proj(attn)
        return x + self.ff2(self.act(self.ff1(self.ln2(x))))


_ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "digits_cnn": DigitsCNN,
    "mlp": MLP,
    "mobilenet_v2": MobileNetV2,
    "transformer_block": TransformerBlock,
}


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def _train_on_digits(
    model: nn.Module, *, epochs: int, lr: float, batch_size: int = 64, flatten: bool = False
) -> None:
    """Trains ``model`` in place on the digits training split with Adam and cross-entropy."""
    x_np, y_np, _, _ = _digits_split()
    x = torch.tensor(x_np)
    if flatten:
        x = x.reshape(len(x), -1)
    y = torch.tensor(y_np)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    # A private generator makes the shuffling order independent of anything else using torch RNG.
    generator = torch.Generator().manual_seed(SEED)
    model.train()
    # One thread: float sums then add up in one order, so the weights are the same on any machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(epochs):
            for idx in torch.randperm(len(x), generator=generator).split(batch_size):
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x[idx]), y[idx])
                loss.backward()
                optimizer.step()
            scheduler.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()


def _randomize_batchnorm(model: nn.Module, calibration: torch.Tensor) -> None:
    """Gives every BatchNorm non-trivial affine params and realistic running statistics.

    Freshly constructed BN layers are identities (gamma=1, beta=0, mean=0, var=1), which would make
    BN folding and quantization tests vacuous. We randomize the affine parameters, then estimate
    the running statistics from a seeded calibration batch so activations stay well scaled
    through the depth of the network instead of exploding or vanishing.
    """
    batchnorms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for bn in batchnorms:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_(0.0, 0.1)
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average over the calibration passes
        model.train()
        for chunk in calibration.split(16):
            model(chunk)
        model.eval()
        for bn in batchnorms:
            bn.momentum = 0.1  # back to the default so the module behaves normally afterwards


def _make_weights(name: str) -> dict[str, torch.Tensor]:
    started = time.perf_counter()
    with _seeded():
        model = _ARCHITECTURES[name]()
        if isinstance(model, DigitsCNN):
            _train_on_digits(model, epochs=10, lr=5e-3)
        elif isinstance(model, MLP):
            _train_on_digits(model, epochs=20, lr=1e-2, flatten=True)
        elif isinstance(model, MobileNetV2):
            _randomize_batchnorm(model, torch.randn(64, *get_spec(name).input_shape))
        elif isinstance(model, TransformerBlock):
            with torch.no_grad():
                # Non-trivial LayerNorm affine params, for the same reason as BN above.
                for ln in (model.ln1, model.ln2):
                    ln.weight.uniform_(0.5, 1.5)
                    ln.bias.normal_(0.0, 0.1)
    model.eval()
    logger.debug("zoo: made %s weights in %.2fs", name, time.perf_counter() - started)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@functools.cache
def _cached_weights(name: str) -> dict[str, torch.Tensor]:
    return _make_weights(name)


def torch_module(name: str) -> nn.Module:
    """Returns a fresh eval-mode torch module with the zoo model's deterministic weights.

    Each call returns a new module (mutating it does not affect later builds); the weights are
    computed, and for the digits models trained, once per process.

    Args:
        name: A name from :func:`ferry.zoo.names`.

    Returns:
        The module, in eval mode, with ``requires_grad`` disabled on its parameters.

    Raises:
        KeyError: If ``name`` is not a zoo model.
    """
    get_spec(name)  # uniform error message for unknown names
    # Construct under the seed only so construction does not consume the caller's RNG; the
    # random init is overwritten by the cached state dict right after.
    with _seeded():
        model = _ARCHITECTURES[name]()
    model.load_state_dict(_cached_weights(name))  # copies into the module's own tensors
    model.eval()
    model.requires_grad_(False)
    return model
