"""MSE calibration: each tensor's clipping range chosen to minimize the quantization error.

Before -> After::

    histograms of |x| for each tensor (ONNX Runtime's histogram collector, calibration data)
        -> ranges [-t, t] (cut to the values seen) with t minimizing the expected squared error
           of rounding inside the range plus clipping outside it, saved as ONNX Runtime's
           calibration cache, which its quantizer then reads instead of calibrating

ONNX Runtime's calibrators offer min/max, percentile and entropy; MSE is the one TensorRT and
NNCF practice recommends for activations with long tails (a few outliers widen min/max until the
bulk of the values round to a handful of levels).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["mse_threshold", "write_mse_ranges"]

#: Histogram bins per tensor (ONNX Runtime's default for its histogram calibrators).
BINS = 2048


def mse_threshold(counts: np.ndarray, edges: np.ndarray, levels: int = 255) -> float:
    """The ``t`` minimizing the squared error of quantizing values with this histogram of
    magnitudes to ``levels`` steps over ``[-t, t]``: ``step**2 / 12`` per value inside (uniform
    rounding error), ``(|x| - t)**2`` per value clipped."""
    counts = counts.astype(np.float64)
    centers = (edges[:-1] + edges[1:]).astype(np.float64) / 2
    candidates = edges[1:].astype(np.float64)
    # Sums over the bins above each candidate, from the end: S0 = n, S1 = sum n*m, S2 = sum n*m^2.
    s0 = np.cumsum(counts[::-1])[::-1]
    s1 = np.cumsum((counts * centers)[::-1])[::-1]
    s2 = np.cumsum((counts * centers**2)[::-1])[::-1]
    above = np.append(s0[1:], 0.0), np.append(s1[1:], 0.0), np.append(s2[1:], 0.0)
    inside = np.cumsum(counts)
    step = 2 * candidates / levels
    error = inside * step**2 / 12 + above[2] - 2 * candidates * above[1] + candidates**2 * above[0]
    return float(candidates[int(np.argmin(error))])


def write_mse_ranges(model: Path, reader: Any, folder: Path, cache: Path) -> None:
    """Collect histograms of ``model``'s tensors on ``reader``'s samples and save MSE ranges as
    ONNX Runtime's calibration cache (labelled Percentile: the calibrator that collected them)."""
    from onnxruntime.quantization.calibrate import (
        CalibrationMethod,
        TensorsData,
        create_calibrator,
        save_tensors_data,
    )

    with contextlib.redirect_stdout(io.StringIO()):  # its calibrators print progress
        calibrator = create_calibrator(
            model,
            None,
            augmented_model_path=folder / "augmented.onnx",
            calibrate_method=CalibrationMethod.Percentile,
            extra_options={"symmetric": True, "num_bins": BINS, "percentile": 100.0},
        )
        calibrator.collect_data(reader)
    ranges: dict[str, Any] = {}
    for name, (counts, edges, lowest, highest) in calibrator.collector.histogram_dict.items():
        t = mse_threshold(np.asarray(counts), np.asarray(edges))
        dtype = np.asarray(edges).dtype
        low = np.array(max(float(lowest), -t), dtype=dtype)
        high = np.array(min(float(highest), t), dtype=dtype)
        ranges[name] = (low, high, np.asarray(counts), np.asarray(edges))
    save_tensors_data(TensorsData(CalibrationMethod.Percentile, ranges), cache)
