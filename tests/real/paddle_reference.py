"""Paddle's own inference on a kit model: the reference the real tier judges conversions against.

Paddle lives in a Python of its own (``scripts/setup-paddle.sh``; ``$FERRY_PADDLE_PYTHON``), so
:func:`paddle_outputs` runs this file there as a script, with the inputs and outputs passed as
``.npz`` files. The script runs the model as a user of Paddle would: ``paddle.inference`` with
its default configuration (graph optimizations on) on the CPU. It shares no code with ferry's
converter, whose own reference runs the program unoptimized in its worker.

When run as a script it imports only numpy and paddle: ``python paddle_reference.py MODEL
PARAMS INPUTS.npz OUTPUTS.npz``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np


def paddle_python() -> Path:
    """The Python with Paddle: ``$FERRY_PADDLE_PYTHON``, else what the converter would use."""
    named = os.environ.get("FERRY_PADDLE_PYTHON")
    if named:
        return Path(named)
    from ferry.converters import find_paddle_python

    found = find_paddle_python()
    if found is None:
        raise RuntimeError(
            "no Python with paddlepaddle: run scripts/setup-paddle.sh or set FERRY_PADDLE_PYTHON"
        )
    return found


def paddle_outputs(model: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the inference model ``model`` (``.pdmodel`` or ``.json``) on ``feeds`` with Paddle;
    return its outputs by Paddle's fetch names, in fetch order."""
    params = model.with_suffix(".pdiparams")
    with tempfile.TemporaryDirectory(prefix="ferry-paddle-ref-") as tmp:
        inputs, outputs = Path(tmp) / "inputs.npz", Path(tmp) / "outputs.npz"
        np.savez(inputs, **{k: np.asarray(v) for k, v in feeds.items()})
        env = dict(os.environ, GLOG_minloglevel="2", GLOG_v="0")
        proc = subprocess.run(
            [str(paddle_python()), __file__, str(model), str(params), str(inputs), str(outputs)],
            capture_output=True,
            text=True,
            errors="replace",
            env=env,
            cwd=tmp,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"Paddle failed to run {model} (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        with np.load(outputs) as data:
            names = [str(n) for n in data["__names__"]]
            return {n: np.array(data[f"out{i}"]) for i, n in enumerate(names)}


def _main(model: str, params: str, inputs: str, outputs: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    from paddle import inference

    config = inference.Config(model, params) if Path(params).is_file() else inference.Config(model)
    config.disable_gpu()
    config.disable_glog_info()
    predictor = inference.create_predictor(config)
    with np.load(inputs) as feeds:
        for name in predictor.get_input_names():
            value = np.ascontiguousarray(feeds[name])
            handle = predictor.get_input_handle(name)
            handle.reshape(list(value.shape))
            handle.copy_from_cpu(value)
    predictor.run()
    names = predictor.get_output_names()
    got = {f"out{i}": predictor.get_output_handle(n).copy_to_cpu() for i, n in enumerate(names)}
    np.savez(outputs, __names__=np.array(names), **got)


if __name__ == "__main__":
    _main(*sys.argv[1:5])
