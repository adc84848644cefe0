"""The bundled example: a small CNN trained on scikit-learn's digits (real handwritten digits).

    python examples/digits_cnn.py export OUT     # OUT/digits_cnn.pt2 (torch.export) + OUT/digits.npy
    python examples/digits_cnn.py accuracy MODEL # top-1 accuracy of an ONNX model through ferry

``export`` trains the CNN (seconds), saves it as a torch.export archive with a dynamic batch, and
saves 8 real test images; ``ferry convert`` then takes the archive to ONNX. ``accuracy`` runs the
converted model through ferry on all 360 test images.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import ferry
from ferry import zoo


def export(out: Path) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    module = zoo.torch_module("digits_cnn")
    x_train, _, x_test, y_test = zoo.digits_data()
    batch = torch.export.Dim("batch", min=1, max=1024)
    # The example batch is 2: torch.export fixes dims whose example size is 1.
    program = torch.export.export(
        module, (torch.from_numpy(x_train[:2]),), dynamic_shapes=({0: batch},)
    )
    torch.export.save(program, out / "digits_cnn.pt2")
    np.save(out / "digits.npy", x_test[:8])
    with torch.no_grad():
        predicted = module(torch.from_numpy(x_test)).argmax(dim=1).numpy()
    print(f"wrote {out / 'digits_cnn.pt2'} and {out / 'digits.npy'} (labels {y_test[:8].tolist()})")
    print(f"PyTorch test accuracy: {np.mean(predicted == y_test):.1%} on {len(y_test)} images")


def accuracy(model: Path) -> None:
    session = ferry.load(model)
    name = session.inputs[0].name  # the exporter names it after forward's argument

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (images,) = feeds.values()
        return session.run({name: images})

    print(
        f"{model} through ferry (ONNX Runtime, CPU): test accuracy {zoo.digits_accuracy(run):.1%}"
    )


if __name__ == "__main__":
    commands = {"export": export, "accuracy": accuracy}
    if len(sys.argv) != 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](Path(sys.argv[2]))
