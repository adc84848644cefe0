"""Export of the zoo models to ONNX (``onnx_ir.Model``) and atomic saving.

torch is imported lazily inside the functions that need it so that importing this module (and
thus calling :func:`example_inputs`) stays cheap.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import numpy as np
import onnx_ir as ir

from ferry.converters import detach_from_torch, silence_exporter_logs
from ferry.zoo._specs import SPECS, get_spec

logger = logging.getLogger(__name__)

#: ONNX opset the zoo exports to. 20 is the first with a native ``Gelu`` op; ORT >= 1.17 runs it.
DEFAULT_OPSET = 20

#: Upper bound of the dynamic batch dimension (torch.export needs a finite range to reason in).
MAX_BATCH = 1024


def names() -> list[str]:
    """Returns the names of all zoo models, sorted."""
    return sorted(SPECS)


def _export(name: str, *, dynamic_batch: bool, opset: int) -> ir.Model:
    import torch

    from ferry.zoo._models import torch_module

    spec = get_spec(name)
    module = torch_module(name)
    # torch.export specializes dims whose example size is 0 or 1, so a dynamic batch needs an
    # example batch of at least 2. Constant values: the traced values do not matter.
    example_batch = 2 if dynamic_batch else 1
    example = torch.zeros(example_batch, *spec.input_shape, dtype=torch.float32)
    dynamic_shapes = (
        ({0: torch.export.Dim("batch", min=1, max=MAX_BATCH)},) if dynamic_batch else None
    )
    with silence_exporter_logs():
        program = torch.onnx.export(
            module,
            (example,),
            dynamo=True,
            input_names=[spec.input_name],
            output_names=[spec.output_name],
            dynamic_shapes=dynamic_shapes,
            opset_version=opset,
            optimize=True,
            verbose=False,
        )
    if program is None:  # only the legacy (dynamo=False) exporter returns None
        raise RuntimeError(f"torch.onnx.export returned no program for {name!r}")
    return program.model


def build(name: str, *, dynamic_batch: bool = True, opset: int = DEFAULT_OPSET) -> ir.Model:
    """Builds a zoo model as an ONNX IR model.

    Deterministic: building the same model twice (in one process or across processes on the same
    machine) gives identical graphs and initializers. Weights are computed once per process (the
    digits models train for a couple of seconds on first use); each call re-exports, which takes
    about a second.

    Args:
        name: A name from :func:`names`.
        dynamic_batch: If true, the first input/output dim is a symbolic ``"batch"``
            (1..1024); otherwise the batch is fixed at 1.
        opset: Default-domain ONNX opset to export to (18 or newer). Below 20, exact GELU is
            decomposed into ``Erf`` arithmetic instead of a ``Gelu`` node.

    Returns:
        A fresh, self-contained model (NumPy-backed initializers) that the caller may mutate.

    Raises:
        KeyError: If ``name`` is not a zoo model.
        ValueError: If ``opset`` is below 18.
    """
    get_spec(name)
    if opset < 18:
        raise ValueError(f"the zoo exports with opset >= 18, got {opset}")
    started = time.perf_counter()
    model = _export(name, dynamic_batch=dynamic_batch, opset=opset)
    detach_from_torch(model)
    model.graph.name = name
    model.doc_string = get_spec(name).description
    model.metadata_props["ferry.zoo.model"] = name
    logger.debug("zoo: built %s in %.2fs", name, time.perf_counter() - started)
    return model


def save(
    name: str,
    directory: str | Path,
    *,
    dynamic_batch: bool = True,
    opset: int = DEFAULT_OPSET,
) -> Path:
    """Builds a zoo model and writes it to ``directory / f"{name}.onnx"`` atomically.

    The model is written to a temporary file in the same directory and then moved into place with
    ``os.replace`` semantics, so readers never observe a partial file and no temporary file is
    left behind on failure.

    Args:
        name: A name from :func:`names`.
        directory: Output directory; created (with parents) if missing.
        dynamic_batch: See :func:`build`.
        opset: See :func:`build`.

    Returns:
        The path of the written ``.onnx`` file.

    Raises:
        KeyError: If ``name`` is not a zoo model.
    """
    model = build(name, dynamic_batch=dynamic_batch, opset=opset)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.onnx"
    # A unique hidden name in the same directory (same filesystem, so the rename is atomic).
    # Not tempfile.mkstemp: its 0600 mode would stick to the final file after the rename.
    tmp = directory / f".{name}.{uuid.uuid4().hex}.onnx.tmp"
    try:
        ir.save(model, tmp)
        tmp.replace(target)  # os.replace: atomic within one filesystem
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def example_inputs(name: str, batch: int = 1, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Returns a feed dict with the right input names, shapes and dtypes for a zoo model.

    The digits models get real images drawn (with the given seed) from the digits training
    split, so the data is representative, e.g. for quantization calibration; the other models
    get standard-normal data.

    Args:
        name: A name from :func:`names`.
        batch: Batch size (the leading dim).
        seed: Seed for :func:`numpy.random.default_rng`; same seed, same data.

    Returns:
        ``{input_name: array}`` with a C-contiguous float32 array of shape
        ``[batch, *input_shape]``.

    Raises:
        KeyError: If ``name`` is not a zoo model.
        ValueError: If ``batch`` is not positive.
    """
    spec = get_spec(name)
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    rng = np.random.default_rng(seed)
    if spec.digits:
        from ferry.zoo._data import _digits_split

        x_train = _digits_split()[0]
        idx = rng.choice(len(x_train), size=batch, replace=batch > len(x_train))
        data = x_train[idx].reshape(batch, *spec.input_shape)
    else:
        data = rng.standard_normal((batch, *spec.input_shape))
    return {spec.input_name: np.asarray(data, dtype=spec.input_dtype, order="C")}
