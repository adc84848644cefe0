"""Sparse TFLite weights: densifying is bounded by the values stored, whatever the file claims."""

from __future__ import annotations

import numpy as np
import pytest


def test_corrupt_sparsity_is_refused_before_it_allocates() -> None:
    """Sparse weights: the densified size and every level's paths are bounded by the stored
    values (a corrupt dense_size of 2**40 would otherwise allocate before any check)."""
    from ferry.errors import ModelLoadError
    from ferry.tflite._reader import densify_tflite
    from ferry.tflite._schema import TFLiteDimMetadata, TFLiteSparsity

    values = np.arange(4, dtype=np.float32)
    dense = TFLiteDimMetadata(True, 2, None, None)
    csr = TFLiteDimMetadata(False, 0, np.array([0, 2, 4]), np.array([0, 1, 0, 1]))
    good = densify_tflite(values, TFLiteSparsity((0, 1), (), (dense, csr)), [2, 2])
    assert good.tolist() == [[0, 1], [2, 3]]
    huge = TFLiteDimMetadata(True, 1 << 40, None, None)
    with pytest.raises(ModelLoadError, match="more elements than"):
        densify_tflite(values, TFLiteSparsity((0, 1), (), (huge, dense)), [2, 2])
    with pytest.raises(ModelLoadError, match="dense form would hold"):
        densify_tflite(values, TFLiteSparsity((0, 1), (), (dense, dense)), [1 << 20, 1 << 20])
    many = TFLiteDimMetadata(False, 0, np.array([0, 1 << 40]), np.array([0]))
    with pytest.raises(ModelLoadError, match="stores 4 values"):
        densify_tflite(
            values,
            TFLiteSparsity((0, 1), (), (TFLiteDimMetadata(True, 1, None, None), many)),
            [1, 2],
        )
