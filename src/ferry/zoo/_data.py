"""The scikit-learn digits data set and top-1 accuracy scoring on it.

scikit-learn is imported lazily: it ships the digits data inside the package (no download), but
importing it costs a few hundred milliseconds that ``import ferry.zoo`` should not pay.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ferry.zoo._specs import get_spec

#: Fraction of the 1797 digits held out for testing (stratified, ``random_state=0``).
TEST_FRACTION = 0.2

RunFn = Callable[[dict[str, np.ndarray]], Any]
"""A model runner: takes ``{input_name: array}``, returns a mapping or sequence of outputs."""


@functools.lru_cache(maxsize=1)
def _digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    # Pixels are integer intensities 0..16; scale to [0, 1] so models see unit-range inputs.
    images = (data.images.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    labels = data.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=TEST_FRACTION, random_state=0, stratify=labels
    )
    arrays = (x_train, y_train, x_test, y_test)
    for array in arrays:
        # The cached arrays are shared by every caller; make accidental in-place edits fail loudly.
        array.flags.writeable = False
    return arrays


def digits_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Returns the fixed train/test split of scikit-learn's digits data set.

    The split is stratified with ``test_size=0.2`` and ``random_state=0``, so it is the same on
    every call and every machine: 1437 training and 360 test samples.

    Returns:
        ``(x_train, y_train, x_test, y_test)``: images as float32 ``[N, 1, 8, 8]`` scaled to
        ``[0, 1]``, labels as int64 ``[N]``. The arrays are fresh copies, safe to modify.
    """
    x_train, y_train, x_test, y_test = _digits_split()
    return x_train.copy(), y_train.copy(), x_test.copy(), y_test.copy()


def _logits_from(result: Any, output_name: str) -> np.ndarray:
    """Picks the logits out of whatever a runner returned."""
    if isinstance(result, np.ndarray):
        return result
    if isinstance(result, Mapping):
        if output_name in result:
            return np.asarray(result[output_name])
        if not result:
            raise ValueError("run_fn returned an empty mapping")
        return np.asarray(next(iter(result.values())))
    if isinstance(result, Sequence) and not isinstance(result, (str, bytes)):
        if not result:
            raise ValueError("run_fn returned an empty sequence")
        return np.asarray(result[0])
    raise TypeError(
        f"run_fn must return a mapping, a sequence or an array of outputs, got {type(result)!r}"
    )


def digits_accuracy(
    run_fn: RunFn, *, name: str = "digits_cnn", batch_size: int | None = None
) -> float:
    """Computes top-1 accuracy of a digits model on the held-out test split.

    Args:
        run_fn: Runs the model: takes ``{input_name: float32 array}`` and returns the outputs as
            a mapping (the ``logits`` entry is used if present, else the first), a sequence (the
            first element is used, as ``InferenceSession.run(None, feeds)`` returns), or a bare
            array. Logits or probabilities both work, only the argmax matters.
        name: The zoo model whose input layout to feed: ``"digits_cnn"`` gets ``[N, 1, 8, 8]``,
            ``"mlp"`` gets flattened ``[N, 64]``. Also valid for any model with the same I/O.
        batch_size: Samples per ``run_fn`` call; ``None`` feeds the whole test split at once.
            Use 1 for a model exported with a static batch.

    Returns:
        The fraction of test samples whose argmax over the last axis equals the label.

    Raises:
        ValueError: If ``name`` is not a digits model, ``batch_size`` is not positive, or the
            runner's output does not have one row per sample.
    """
    spec = get_spec(name)
    if not spec.digits:
        raise ValueError(f"zoo model {name!r} is not a digits model")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    _, _, x_test, y_test = _digits_split()
    inputs = x_test.reshape((-1, *spec.input_shape))
    step = len(inputs) if batch_size is None else batch_size

    predictions: list[np.ndarray] = []
    for start in range(0, len(inputs), step):
        # Runners may keep or mutate the feed (e.g. OrtValue wrapping); hand them a private copy.
        chunk = np.array(inputs[start : start + step], dtype=spec.input_dtype)
        logits = _logits_from(run_fn({spec.input_name: chunk}), spec.output_name)
        logits = logits.reshape(len(chunk), -1)
        predictions.append(np.argmax(logits, axis=-1))
    predicted = np.concatenate(predictions)
    return float(np.mean(predicted == y_test))
