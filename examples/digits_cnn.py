"""The bundled example: a small CNN trained on scikit-learn's digits (real handwritten digits).

    python examples/digits_cnn.py export OUT          # OUT/digits_cnn.pt2, digits.npy, train.npy
    python examples/digits_cnn.py accuracy MODEL...   # top-1 accuracy, each in its own runtime

``export`` trains the CNN (seconds), saves it as a torch.export archive with a dynamic batch, 8
real test images (``digits.npy``) and the 1,437 training images without their labels
(``train.npy``: calibration for ``ferry quantize``, data for ``ferry distill``); ``ferry
convert`` then takes the archive to ONNX. ``accuracy`` runs each model on all 360 test images:
an ``.onnx`` file through ferry (ONNX Runtime), a ``.tflite`` file in LiteRT, a web bundle folder
in Node (onnxruntime-web, through the bundle's own files).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import ferry
from ferry import zoo

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


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
    np.save(out / "train.npy", x_train)  # images only: quantize and distill need no labels
    with torch.no_grad():
        predicted = module(torch.from_numpy(x_test)).argmax(dim=1).numpy()
    print(
        f"wrote {out / 'digits_cnn.pt2'}, {out / 'digits.npy'} (labels {y_test[:8].tolist()}) "
        f"and {out / 'train.npy'} ({len(x_train)} training images, unlabeled)"
    )
    print(f"PyTorch test accuracy: {np.mean(predicted == y_test):.1%} on {len(y_test)} images")


def _onnx(model: Path) -> tuple[Runner, int | None, str]:
    session = ferry.load(model)
    name = session.inputs[0].name  # the exporter names it after forward's argument

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (images,) = feeds.values()
        return session.run({name: images})

    return run, None, "ferry (ONNX Runtime, CPU)"


def _tflite(model: Path) -> tuple[Runner, int | None, str]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model))
    interpreter.allocate_tensors()
    (source,) = interpreter.get_input_details()
    (sink,) = interpreter.get_output_details()

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (images,) = feeds.values()
        interpreter.set_tensor(source["index"], images.reshape(source["shape"]))
        interpreter.invoke()
        return {"logits": interpreter.get_tensor(sink["index"])}

    # The export fixed the batch at 1 (a phone classifies one image at a time).
    return run, 1, "LiteRT (XNNPACK)"


def _web(bundle: Path) -> tuple[Runner, int | None, str]:
    from ferry.web import run_bundle_in_node

    name = ferry.load(bundle / "model.onnx").inputs[0].name

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (images,) = feeds.values()
        return run_bundle_in_node(bundle, {name: images})

    return run, None, "Node (onnxruntime-web, wasm)"


def accuracy(models: list[Path]) -> None:
    for model in models:
        if model.is_dir():
            run, batch, where = _web(model)
        elif model.suffix == ".tflite":
            run, batch, where = _tflite(model)
        else:
            run, batch, where = _onnx(model)
        score = zoo.digits_accuracy(run, batch_size=batch)
        print(f"{model} in {where}: test accuracy {score:.1%}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "export":
        export(Path(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "accuracy":
        accuracy([Path(p) for p in sys.argv[2:]])
    else:
        sys.exit(__doc__)
