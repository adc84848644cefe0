"""Static descriptions of the zoo models (no torch, no sklearn).

Kept separate from the torch code so that cheap queries such as :func:`ferry.zoo.names` and
:func:`ferry.zoo.example_inputs` never pay for importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ModelSpec:
    """The I/O contract of one exported zoo model.

    Attributes:
        name: The zoo name, also the stem of the saved file.
        input_name: Name of the single graph input.
        input_shape: Shape of one sample, i.e. the input shape without the leading batch dim.
        output_name: Name of the single graph output.
        output_shape: Shape of one sample's output, without the leading batch dim.
        digits: Whether the model was trained on scikit-learn's digits (and so can be scored with
            :func:`ferry.zoo.digits_accuracy`).
        description: One line for humans.
        input_dtype: NumPy dtype of the input (every zoo model currently takes float32).
    """

    name: str
    input_name: str
    input_shape: tuple[int, ...]
    output_name: str
    output_shape: tuple[int, ...]
    digits: bool
    description: str
    input_dtype: type[np.floating] = np.float32


SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="digits_cnn",
            input_name="input",
            input_shape=(1, 8, 8),
            output_name="logits",
            output_shape=(10,),
            digits=True,
            description="Two-conv CNN trained on sklearn digits (8x8 grayscale, 10 classes).",
        ),
        ModelSpec(
            name="mlp",
            input_name="input",
            input_shape=(64,),
            output_name="logits",
            output_shape=(10,),
            digits=True,
            description="64-128-64-10 ReLU MLP trained on flattened sklearn digits.",
        ),
        ModelSpec(
            name="mobilenet_v2",
            input_name="input",
            input_shape=(3, 32, 32),
            output_name="logits",
            output_shape=(10,),
            digits=False,
            description="Small MobileNetV2-style net (inverted residuals, depthwise convs, "
            "ReLU6/Hardswish), seeded random weights.",
        ),
        ModelSpec(
            name="transformer_block",
            input_name="input",
            input_shape=(16, 64),
            output_name="output",
            output_shape=(16, 64),
            digits=False,
            description="One pre-norm transformer encoder block (d_model=64, 4 heads, FFN 256, "
            "exact GELU), seeded random weights.",
        ),
    )
}


def get_spec(name: str) -> ModelSpec:
    """Looks up a model spec by zoo name.

    Args:
        name: A name from :func:`ferry.zoo.names`.

    Returns:
        The model's spec.

    Raises:
        KeyError: If ``name`` is not a zoo model; the message lists the valid names.
    """
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; expected one of {sorted(SPECS)}") from None
