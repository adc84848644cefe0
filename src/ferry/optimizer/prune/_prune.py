"""``prune``: check the request, prune a copy of the model, check the result, report.

Before -> After::

    model (a file, an artifact, an ir.Model; never modified), method, sparsity
        -> PruneResult: the pruned copy (valid ONNX, runs in ONNX Runtime with outputs of the
           same shapes) and a PruneReport (sizes, MACs, groups cut, groups kept and why)
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.graph import InferTypesPass, constant, graph_inputs, load_model, prepare, shape_of
from ferry.optimizer._host import channel_block
from ferry.optimizer.prune._channel import apply_channel_plans, plan_channels
from ferry.optimizer.prune._groups import _UNARY, channel_groups
from ferry.optimizer.prune._macs import macs
from ferry.optimizer.prune._report import PruneReport, PruneResult, sizes
from ferry.optimizer.prune._sparse import magnitude, sparse_2_4
from ferry.optimizer.prune._weights import is_op

__all__ = ["CRITERIA", "METHODS", "prune"]

logger = logging.getLogger(__name__)

METHODS = ("channel", "magnitude", "2:4")
CRITERIA = ("l1", "l2", "bn-gamma", "activation")

_NOTES = {
    "channel": "channels removed physically: smaller and faster on dense kernels; recover "
    "accuracy by distilling from the original (ferry distill)",
    "magnitude": "weights zeroed in place: smaller when compressed, not faster on dense kernels",
    "2:4": "2 of every 4 input-channel weights zeroed: faster only on engines with sparse "
    "kernels (TensorRT on Ampere or later), smaller when compressed",
}


def prune(
    model: ir.Model | str | os.PathLike[str],
    *,
    method: str = "channel",
    sparsity: float = 0.5,
    exclude: Sequence[str] = (),
    criterion: str = "l1",
    multiple: int | None = None,
    optimize: bool = True,
    verify: bool = True,
    data: Any = None,
) -> PruneResult:
    """Prune a copy of ``model``.

    Args:
        model: the model, a path to one or an artifact folder; it is not changed.
        method: ``channel`` removes whole channels (smaller and faster); ``magnitude`` zeroes the
            smallest weights of each layer (smaller once compressed); ``2:4`` zeroes 2 of every 4
            input-channel weights (faster on sparse kernels).
        sparsity: the fraction removed, in [0, 1): of each channel group's channels (at least
            one channel stays), or of each layer's weights. 2:4 takes 0.5 only.
        exclude: names of nodes left alone: their output channels are kept (channel), their
            weights untouched (magnitude, 2:4).
        criterion: how channels are ranked: ``l1`` or ``l2`` norm of the filters that make them
            (summed over a group), or ``bn-gamma`` (|scale| of their BatchNormalization; l1
            where a group has none).
        multiple: channel pruning keeps a multiple of this many channels in each group whose
            count is one (rounding up), so that CPU kernels' channel blocks stay full; None:
            this machine's block (16 with AVX-512, else 8: :func:`channel_block`); 1 keeps
            exactly ``1 - sparsity``.
        optimize: before channel pruning, run ferry's basic optimization (BatchNorms folded into
            Convs, exporters' casts and transposes removed), which lets more groups be followed.
        verify: check the result with the ONNX checker and shape inference, and run it in ONNX
            Runtime against the model it came from.
        data: real samples (as :func:`ferry.quantize` takes them: a ``.npz``/``.npy``, a folder
            of images, or feed dicts); with them, channel pruning moves the removed channels'
            average contribution into the next layer's bias (measured on up to 64 samples), so
            the pruned model starts closer to the original.

    Returns:
        The pruned model and its report.

    Raises:
        InvalidInputError: an unknown method or criterion, a sparsity outside [0, 1), or an
            ``exclude`` name that is not a node of the model.
        ModelLoadError: the model cannot be read.
    """
    _check_request(method, sparsity, criterion, exclude)
    if multiple is None:
        multiple = channel_block()
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise InvalidInputError(f"multiple must be a whole number >= 1, got {multiple!r}")
    source = load_model(model)
    work = prepare(source)
    names = {node.name for node in work.graph.all_nodes() if node.name}
    unknown = [name for name in exclude if name not in names]
    if unknown:
        sample = ", ".join(repr(n) for n in sorted(names)[:5])
        raise InvalidInputError(
            f"exclude names {', '.join(map(repr, unknown))}, which the model does not have; "
            f"use node names as `ferry inspect` lists them (e.g. {sample})"
        )
    if method == "channel":
        result = _channel(work, float(sparsity), exclude, criterion, optimize, multiple, data)
    else:
        result = _zeroing(work, method, float(sparsity), frozenset(exclude))
    if verify:
        verify_pruned(result.model, reference=source)
    return result


#: Samples the activation means for bias compensation are measured on, at most.
_MEAN_SAMPLES = 64


def activation_means(
    model: ir.Model, values: set[ir.Value], data: Any
) -> tuple[dict[ir.Value, np.ndarray], dict[ir.Value, np.ndarray]]:
    """Each of ``values``' mean and mean magnitude per channel (axis 1) over ``data``, computed
    in ONNX Runtime."""
    import onnx
    import onnxruntime as ort

    from ferry.optimizer.quantize import load_samples
    from ferry.runtime import load

    samples = load_samples(data, load(model).inputs)
    feeds = (samples.calibration + samples.held_back)[:_MEAN_SAMPLES]
    named = {v.name: v for v in values if v.name and not v.is_graph_input()}
    proto = ir.to_proto(model)
    present = {o.name for o in proto.graph.output}
    for name in named:
        if name not in present:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = list(named)
    sums: dict[str, np.ndarray] = {}
    magnitudes: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, array in zip(names, session.run(names, dict(feed))):
            axes = tuple(a for a in range(array.ndim) if a != 1)
            values64 = array.astype(np.float64)
            sums[name] = sums.get(name, 0) + values64.mean(axis=axes)
            magnitudes[name] = magnitudes.get(name, 0) + np.abs(values64).mean(axis=axes)
    count = len(feeds)
    return (
        {named[n]: total / count for n, total in sums.items()},
        {named[n]: total / count for n, total in magnitudes.items()},
    )


def _check_request(method: str, sparsity: float, criterion: str, exclude: Sequence[str]) -> None:
    if method not in METHODS:
        raise InvalidInputError(
            f"unknown pruning method {method!r}; use one of {', '.join(METHODS)}"
        )
    if criterion not in CRITERIA:
        raise InvalidInputError(
            f"unknown pruning criterion {criterion!r}; use one of {', '.join(CRITERIA)}"
        )
    if (
        isinstance(sparsity, bool)
        or not isinstance(sparsity, numbers.Real)
        or not math.isfinite(float(sparsity))
        or not 0 <= float(sparsity) < 1
    ):
        raise InvalidInputError(
            f"sparsity must be a number in [0, 1) (the fraction removed), got {sparsity!r}"
        )
    if method == "2:4" and float(sparsity) not in (0.5,):
        raise InvalidInputError(
            f"2:4 pruning removes exactly half (2 of every 4); pass sparsity=0.5, not {sparsity!r}"
        )
    if isinstance(exclude, str):
        raise InvalidInputError(
            f"exclude takes a list of node names, got the string {exclude!r}; pass [{exclude!r}]"
        )


def _channel(
    work: ir.Model,
    sparsity: float,
    exclude: Sequence[str],
    criterion: str,
    optimize: bool,
    multiple: int,
    data: Any = None,
) -> PruneResult:
    excluded = _excluded_values(work, exclude)
    gammas: dict[str, np.ndarray] = {}
    if criterion == "bn-gamma":
        # Folding a BatchNorm into its Conv loses its scale; the folded Conv's output keeps the
        # BatchNorm's output name, which is how the scale is found again.
        for node in work.graph:
            gamma = constant(node.inputs[1]) if is_op(node, "BatchNormalization") else None
            if gamma is not None and node.outputs[0].name:
                gammas[node.outputs[0].name] = gamma.astype(np.float64)
    if optimize:
        from ferry.optimizer._pipeline import pipeline, rule_context

        makers = _makers(work)
        pipeline(rule_context(work, "basic", None))(work)
        work = prepare(work)
        _restore_names(work, makers)
    before, macs_before = sizes(work), macs(work)
    groups = channel_groups(work, excluded)
    means = magnitudes = None
    if data is not None:
        wanted = {
            v for g in groups for c in g.consumers for v in c.node.inputs[:1] if v is not None
        }
        wanted |= {v for g in groups for v in g.values}  # for groups read through a Flatten
        means, magnitudes = activation_means(work, wanted, data)
    elif criterion == "activation":
        raise InvalidInputError(
            "the activation criterion ranks channels by what they carry on real data: give data"
        )
    plans = plan_channels(groups, sparsity, criterion, gammas, multiple, magnitudes)
    apply_channel_plans(groups, plans, means)
    _reinfer(work)
    skipped = [
        {"name": g.name, "reason": "; ".join(g.blocked)}
        for g in groups
        if g.blocked and g.sources and g.derivation is None
    ]
    report = PruneReport(
        method="channel",
        sparsity=sparsity,
        criterion=criterion,
        before=before,
        after=sizes(work),
        macs_before=macs_before,
        macs_after=macs(work),
        groups=tuple(
            {
                "name": p.group.name,
                "nodes": [s.node.name for s in p.group.sources],
                "channels": p.group.channels,
                "kept": len(p.keep),
                "removed": p.removed,
                "criterion": p.criterion,
            }
            for p in plans
        ),
        skipped=tuple(skipped),
        note=_NOTES["channel"],
        multiple=multiple,
    )
    return PruneResult(work, report)


def _makers(model: ir.Model) -> dict[str, str]:
    """For each BatchNorm output, the Conv/Gemm that feeds it (value name -> node name)."""
    found = {}
    for node in model.graph:
        producer = node.inputs[0].producer() if node.inputs and node.inputs[0] else None
        if (
            is_op(node, "BatchNormalization")
            and producer is not None
            and is_op(producer, "Conv", "ConvTranspose", "Gemm", "MatMul")
            and node.outputs[0].name
        ):
            found[node.outputs[0].name] = producer.name or ""
    return found


def _restore_names(model: ir.Model, makers: dict[str, str]) -> None:
    """Give a Conv that optimization made by folding a BatchNorm the name the Conv had, so that
    the report speaks of the user's nodes."""
    taken = {node.name for node in model.graph}
    for node in model.graph:
        name = makers.get(node.outputs[0].name or "") if node.outputs else None
        if name and name not in taken and is_op(node, "Conv", "ConvTranspose", "Gemm", "MatMul"):
            taken.discard(node.name)
            node.name = name
            taken.add(name)


def _excluded_values(model: ir.Model, exclude: Sequence[str]) -> dict[str, str]:
    """The tensors each excluded node's channels reach unchanged (value name -> node name):
    its outputs and those of the BatchNorms and activations after it, so that the exclusion
    survives optimization, which folds a Conv into the BatchNorm's output name."""
    found: dict[str, str] = {}
    by_name = {node.name: node for node in model.graph}
    for name in exclude:
        todo = list(by_name[name].outputs) if name in by_name else []
        while todo:
            value = todo.pop()
            if not value.name or value.name in found:
                continue
            found[value.name] = name
            for user, _ in value.uses():
                if is_op(user, "BatchNormalization", *_UNARY):
                    todo.extend(user.outputs[:1])
    return found


def _zeroing(work: ir.Model, method: str, sparsity: float, exclude: frozenset[str]) -> PruneResult:
    before, macs_before = sizes(work), macs(work)
    skipped: list[tuple[str, str]] = []
    if method == "magnitude":
        layers, skipped = magnitude(work, sparsity, exclude)
    else:
        layers, skipped = sparse_2_4(work, exclude)
    report = PruneReport(
        method=method,
        sparsity=sparsity,
        criterion=None,
        before=before,
        after=sizes(work),
        macs_before=macs_before,
        macs_after=macs(work),
        layers=tuple(layers),
        skipped=tuple({"name": n, "reason": r} for n, r in skipped),
        note=_NOTES[method],
    )
    return PruneResult(work, report)


def _reinfer(model: ir.Model) -> None:
    """Forget the shapes pruning made stale and infer them again (graph outputs keep theirs:
    no group reaching one is pruned)."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    outputs = set(model.graph.outputs)
    for node in model.graph:
        for value in node.outputs:
            if value not in outputs:
                value.shape = None
    RemoveUnusedNodesPass()(model)
    InferTypesPass()(model)


def verify_pruned(model: ir.Model, reference: ir.Model | None = None) -> None:
    """Check that a pruned model is valid ONNX and runs with outputs of the declared shapes.

    The ONNX checker runs with full shape inference (which fails on a weight that no longer fits
    its layer); then ONNX Runtime runs the model on random inputs (symbolic dims as 1) and each
    output must have the shape of the same output of ``reference`` (or its declared shape).

    Raises:
        RuntimeError: the model is not valid or does not run: a bug in ferry's pruning (report
            it; meanwhile ``exclude`` the group named in the message).
    """
    proto = ir.to_proto(model)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as e:  # onnx raises ValidationError and InferenceError
        raise RuntimeError(f"pruning made an invalid model (a bug in ferry): {e}") from e
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - onnxruntime is a dependency of ferry
        logger.info("onnxruntime is not installed: the pruned model was not run")
        return
    feeds = _random_feeds(model)
    try:
        got = _run(ort, proto, feeds)
    except Exception as e:  # onnxruntime raises its own Fail/InvalidArgument kinds
        raise RuntimeError(f"ONNX Runtime cannot run the pruned model (a bug in ferry): {e}") from e
    want: list[tuple[int, ...] | None]
    if reference is not None:
        try:
            want = [o.shape for o in _run(ort, ir.to_proto(reference), feeds)]
        except Exception as e:  # the original itself cannot run on random inputs
            logger.info("the original does not run on random inputs, shapes unchecked: %s", e)
            return
    else:
        want = [_concrete(shape_of(v)) for v in model.graph.outputs]
    for value, array, shape in zip(model.graph.outputs, got, want):
        if shape is not None and tuple(array.shape) != tuple(shape):
            raise RuntimeError(
                f"the pruned model's output {value.name!r} has shape {list(array.shape)}, "
                f"expected {list(shape)} (a bug in ferry's pruning)"
            )


def _concrete(shape: tuple[Any, ...] | None) -> tuple[int, ...] | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def _random_feeds(model: ir.Model) -> dict[str, np.ndarray]:
    """Inputs found to run ``model`` (:func:`ferry.runtime.found_inputs`: sizes that run, ids
    within their tables); should none be found, random floats and zeros with symbolic dims of 1,
    so that the run that follows says what fails."""
    from ferry.runtime import found_inputs

    try:
        return found_inputs(model).feeds
    except InvalidInputError as e:
        logger.info("no inputs found to run the pruned model: %s", e)
    rng = np.random.default_rng(0)
    feeds = {}
    for value in graph_inputs(model):
        shape = [d if isinstance(d, int) else 1 for d in (shape_of(value) or ())]
        dtype = np.dtype(value.dtype.numpy()) if value.dtype is not None else np.dtype(np.float32)
        if np.issubdtype(dtype, np.floating):
            feeds[value.name or ""] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[value.name or ""] = np.zeros(shape, dtype=dtype)
    return feeds


def _run(ort: Any, proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return list(session.run(None, feeds))
