"""tf2onnx, for the TensorFlow converter: ferry's extra handler (``Erfc``), the opset asked for,
running the conversion on a traced function or a frozen TF1 graph, every op it cannot translate
listed in one error, and the converted model's interface (input and output names, dims) fixed to
the source's.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ferry.converters._base import DEFAULT_BATCH, first_line, list_ops
from ferry.converters._tensorflow_load import _max_tf2onnx_opset, _min_opset, _quiet_tensorflow
from ferry.converters._tensorflow_sources import _Input, _Source
from ferry.errors import ConversionError, UnsupportedOpError

__all__: list[str] = []

logger = logging.getLogger(__name__)

# The names tf2onnx gives dims it knows nothing about.
_TF2ONNX_DIM = re.compile(r"unk__\d+")
# ORT's contrib ops: tf2onnx emits them only for extra opsets it is asked for, and ORT runs them.
_RUNNABLE_CUSTOM_DOMAINS = ("com.microsoft",)


def _run_tf2onnx(tf: Any, tf2onnx: Any, concrete: Any, trackable: Any, opset: int) -> Any:
    """Freeze ``concrete`` and convert it; returns the ONNX ModelProto.

    This is ``tf2onnx.convert.from_function`` minus its one flaw: that takes every non-resource
    input of the function for a model input, and a Keras layer holding a constant tensor (a
    Normalization layer's mean and variance) captures it as one. As ``from_keras`` does, captured
    tensors are left out, and a trackable owner (the Keras model, the SavedModel) lets tf2onnx
    export the contents of its lookup tables.
    """
    from tf2onnx import tf_loader

    captured = {t.name for t in concrete.graph.internal_captures}
    input_names = [
        t.name for t in concrete.inputs if t.dtype != tf.resource and t.name not in captured
    ]
    output_names = [t.name for t in concrete.outputs if t.dtype != tf.resource]
    renames = tf2onnx.convert.tensor_names_from_structed(concrete, input_names, output_names)
    with tf.device("/cpu:0"):
        if trackable is not None:
            frozen, tables = tf_loader.from_trackable(
                trackable, concrete, input_names, output_names, False
            )
        else:
            frozen, tables = tf_loader.from_function(concrete, input_names, output_names), None
        # _convert_common is what every tf2onnx entry point (and its CLI) ends in.
        proto, _ = tf2onnx.convert._convert_common(
            frozen,
            name=concrete.name,
            continue_on_error=True,
            opset=opset,
            input_names=input_names,
            output_names=output_names,
            tensors_to_rename=renames,
            initialized_tables=tables,
        )
    return proto


def _run_tf2onnx_graph(
    tf: Any, tf2onnx: Any, src: _Source, inputs: Sequence[_Input], opset: int
) -> Any:
    """Freeze the session's graph between the signature's tensors and convert it; returns the
    ONNX ModelProto. The steps of tf2onnx's own ``--saved_model`` path for TF1 graphs (its
    ``freeze_session`` calls TF1-only APIs under TensorFlow 2), then grappler as ``tf_optimize``
    runs it: that inlines the function calls a TF2-saved graph is made of."""
    from tf2onnx import tf_loader

    assert src.graph is not None
    run = src.graph
    session = run.session
    input_names = list(run.feeds)
    output_names = list(dict.fromkeys(run.fetches.values()))
    renames = {feed: item.name for feed, item in zip(run.feeds, inputs)}
    for key, tensor in run.fetches.items():
        renames.setdefault(tensor, key)
    keep = [t.split(":")[0] for t in (*output_names, *input_names)]
    with session.graph.as_default(), _quiet_tensorflow():
        graph_def = session.graph.as_graph_def(add_shapes=True)
        for node in graph_def.node:
            node.device = ""
    # Inline the function calls first: freezing rewrites the variable reads it knows of
    # (ReadVariableOp, ResourceGather) in the outer graph, but inside a function body it
    # leaves a ResourceGather reading what has become a float constant.
    with tf.Graph().as_default(), _quiet_tensorflow():
        inlined = tf_loader.tf_optimize(input_names, output_names, graph_def)
    with session.graph.as_default(), _quiet_tensorflow():
        frozen = tf.compat.v1.graph_util.convert_variables_to_constants(session, inlined, keep)
        tables = _session_tables(tf, session, frozen)
    with tf.Graph().as_default(), _quiet_tensorflow():
        frozen = tf_loader.tf_optimize(input_names, output_names, frozen)
    shapes = {
        feed: list(item.dims) for feed, item in zip(run.feeds, inputs) if item.dims is not None
    }
    with tf.device("/cpu:0"):
        proto, _ = tf2onnx.convert._convert_common(
            frozen,
            name=src.label,
            continue_on_error=True,
            opset=opset,
            input_names=input_names,
            output_names=output_names,
            tensors_to_rename=renames,
            initialized_tables=tables,
            shape_override=shapes,
        )
    return proto


def _session_tables(tf: Any, session: Any, graph_def: Any) -> dict[str, Any]:
    """The contents of the graph's hash tables (vocabularies), which tf2onnx writes as
    constants; the loader ran their initializers."""
    from tf2onnx import tf_loader

    tables: dict[str, Any] = {}
    for info in tf_loader.get_hash_table_info(graph_def):
        if info.shared_name is None:
            continue
        handle = tf.raw_ops.HashTableV2(
            key_dtype=info.key_dtype, value_dtype=info.val_dtype, shared_name=info.shared_name
        )
        keys, values = tf.raw_ops.LookupTableExportV2(
            table_handle=handle, Tkeys=info.key_dtype, Tvalues=info.val_dtype
        )
        try:
            tables[info.shared_name] = tuple(session.run([keys, values]))
        except Exception:  # a table the session cannot export: tf2onnx lists its ops
            logger.debug("cannot export table %r", info.shared_name, exc_info=True)
    return tables


class _Tf2onnxLog(logging.Handler):
    """Collects tf2onnx's log records while it converts, instead of letting them reach stderr.

    tf2onnx reports unsupported ops and failed handlers only in its log (and goes on converting),
    so the records are the only full list; they are re-logged at DEBUG under this module.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._logger = logging.getLogger("tf2onnx")
        self._saved = (self._logger.level, self._logger.propagate)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        logger.debug("tf2onnx: %s", record.getMessage().splitlines()[0])

    def __enter__(self) -> _Tf2onnxLog:
        self._saved = (self._logger.level, self._logger.propagate)
        # ERROR records must be made even when the application silenced logging above them.
        self._logger.setLevel(min(self._logger.getEffectiveLevel(), logging.WARNING))
        self._logger.propagate = False
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._saved[0])
        self._logger.propagate = self._saved[1]


def _raise_unsupported(
    model: Any, records: Sequence[logging.LogRecord], label: str, opset: int, tf_graph: Any
) -> None:
    """Raise UnsupportedOpError naming every node tf2onnx could not convert, if there is one."""
    failed: dict[str, tuple[str, str | None]] = {}  # node name -> (TF op, why its handler failed)
    for record in records:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg.startswith("Tensorflow op [") and len(args) == 2:
            failed.setdefault(str(args[0]), (str(args[1]), None))
        elif record.msg.startswith("Failed to convert node") and args:
            node = str(args[0])
            why = first_line(record.exc_info[1]) if record.exc_info and record.exc_info[1] else None
            failed[node] = (_tf_op_type(tf_graph, node, args), why)
    # Whatever the log said, a node ONNX does not know would fail later: count it too.
    for node in model.graph.all_nodes():
        name = node.name or ""
        if name not in failed and not _known_op(node, model.opset_imports):
            failed[name] = (node.op_type, None)
    if not failed:
        return
    ops = [(op, node) for node, (op, _) in failed.items()]
    by_op = dict.fromkeys(op for op, _ in ops)
    reasons: dict[str, str] = {}
    for op, why in failed.values():
        if why and op not in reasons:
            reasons[op] = why
    listed = list_ops(ops, reasons={op: f"tf2onnx failed: {why}" for op, why in reasons.items()})
    needs = {op: n for op in by_op if (n := _min_opset(op)) is not None and n > opset}
    advice = []
    if needs:
        wanted = ", ".join(f"{op} needs opset {n}" for op, n in sorted(needs.items()))
        advice.append(
            f"{wanted}: pass opset={max(needs.values())} or higher (tf2onnx writes up to "
            f"{_max_tf2onnx_opset()})"
        )
    failed_handlers = sorted(op for op in reasons if op not in needs)
    if failed_handlers and opset < _max_tf2onnx_opset():
        advice.append(
            f"at a higher opset (tf2onnx writes up to {_max_tf2onnx_opset()}) its handler of "
            f"{', '.join(failed_handlers)} may succeed"
        )
    if set(by_op) - set(needs):
        advice.append(
            f"express {'the others' if needs else 'them'} with ops tf2onnx supports "
            "(https://github.com/onnx/tensorflow-onnx/blob/main/support_status.md)"
        )
    what_to_do = "; ".join(advice)
    raise UnsupportedOpError(
        f"{label}: tf2onnx cannot convert {len(failed)} TensorFlow node(s) of {len(by_op)} op "
        f"type(s) to ONNX opset {opset}: {listed}. {what_to_do[:1].upper()}{what_to_do[1:]}",
        ops=ops,
    )


def _known_op(node: Any, opsets: Mapping[str, int]) -> bool:
    import onnx

    domain = node.domain or ""
    if domain in _RUNNABLE_CUSTOM_DOMAINS:
        return True
    if domain not in ("", "ai.onnx", "ai.onnx.ml"):
        return False
    versions = {d or "": v for d, v in opsets.items()}
    version = versions.get(domain, versions.get("ai.onnx" if domain == "" else "", 0))
    try:
        onnx.defs.get_schema(node.op_type, max_inclusive_version=version, domain=domain)
    except onnx.defs.SchemaError:
        return False
    return True


def _tf_op_type(tf_graph: Any, node: str, args: tuple[Any, ...]) -> str:
    """The TensorFlow op of a node whose tf2onnx handler failed (the log has only its name)."""
    with contextlib.suppress(Exception):  # renamed or inlined by grappler: fall back below
        return str(tf_graph.get_operation_by_name(node).type)
    summary = str(args[2]) if len(args) > 2 else ""
    match = re.match(r"OP=(\S+)", summary)
    return match.group(1) if match else "unknown op"


def _fix_interface(
    model: Any,
    inputs: Sequence[_Input],
    output_order: Sequence[str],
    symbols: Mapping[tuple[str, int], str],
    batch_first: bool,
) -> None:
    """Name inputs as the source does, order outputs as it does, and give open dims good names."""
    import onnx_ir as ir

    graph = model.graph
    if len(graph.inputs) != len(inputs):
        raise ConversionError(
            f"tf2onnx produced {len(graph.inputs)} inputs for a model with {len(inputs)}; "
            "this is a bug in ferry or tf2onnx"
        )
    for value, item in zip(graph.inputs, inputs):
        if value.name != item.name:
            value.name = item.name
        shape = value.shape
        if shape is None:
            continue
        dims: list[int | str | None] = []
        for axis, d in enumerate(shape.dims):
            if isinstance(d, int):
                dims.append(d)
            elif (item.name, axis) in symbols:
                dims.append(symbols[(item.name, axis)])
            elif axis == 0 and (batch_first or len(inputs) == 1):
                dims.append(DEFAULT_BATCH)
            else:
                dims.append(f"{item.name}_{axis}")
        value.shape = ir.Shape(dims)

    order = {name: i for i, name in enumerate(output_order)}
    if {v.name for v in graph.outputs} == set(order):
        graph.outputs.sort(key=lambda v: order[v.name])

    # tf2onnx names every unknown dim afresh (unk__12, unk__13...): that says nothing, and two
    # names for what is one batch dim would mislead. Shape inference names them from the inputs.
    graph_inputs = set(graph.inputs)
    values = [*graph.outputs, *(v for node in graph.all_nodes() for v in node.outputs)]
    for value in values:
        if value in graph_inputs or value.shape is None:
            continue
        if any(
            isinstance(d, ir.SymbolicDim) and _TF2ONNX_DIM.fullmatch(str(d.value or ""))
            for d in value.shape.dims
        ):
            value.shape = ir.Shape(
                [
                    None
                    if isinstance(d, ir.SymbolicDim) and _TF2ONNX_DIM.fullmatch(str(d.value or ""))
                    else d
                    for d in value.shape.dims
                ]
            )
