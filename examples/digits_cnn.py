"""The bundled example: a small CNN trained on scikit-learn's digits, exported to ONNX.

Writes ``OUT/digits_cnn.onnx`` (dynamic batch) and ``OUT/digits.npy`` (8 real test images), then
runs the model through ferry on the whole test split and prints its accuracy.

    python examples/digits_cnn.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import ferry
from ferry import zoo


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = zoo.save("digits_cnn", out)
    _, _, x_test, y_test = zoo.digits_data()
    np.save(out / "digits.npy", x_test[:8])
    session = ferry.load(path)
    accuracy = zoo.digits_accuracy(session.run)
    print(f"wrote {path} and {out / 'digits.npy'} (labels {y_test[:8].tolist()})")
    print(
        f"digits CNN through ferry (ONNX Runtime, CPU): test accuracy {accuracy:.1%} on {len(y_test)} images"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
