"""TensorFlow / Keras -> the unified graph, through tf2onnx.

Before -> After::

    Keras model (in memory, .keras, legacy .h5), SavedModel folder (a signature),
    tf.function / ConcreteFunction / loaded SavedModel object
        -> ir.Model, inputs named as in the source (``image``, not ``image:0``), NHWC layouts
           kept (tf2onnx wraps each Conv in Transposes), outputs named as the Keras outputs or the
           signature's output keys, in the source's order

Every source is reduced to the same thing: a Python function of positional tensors that returns
``{output name: tensor}``. Traced with ``tf.function`` and an input signature, it is what tf2onnx
freezes and converts (the steps of its ``from_function``, minus taking captured constants for
inputs); run eagerly, it is the reference the parity check compares against
(``model(x, training=False)`` for Keras, the signature itself for a SavedModel). tf2onnx's
``from_keras`` is not used: its Keras 3 support has lagged the Keras releases, while tracing
``model(x, training=False)`` works for Keras 3 and ``tf_keras`` alike. ferry adds a tf2onnx handler
for ``Erfc`` (Keras' exact GELU), which tf2onnx 1.17 lacks.

A SavedModel that TensorFlow 2's object loader cannot restore (objects of an older Keras or
optimizer that today's classes no longer revive: ``'_UserObject' object has no attribute
'add_slot'``) is loaded with the TF1 loader instead: its MetaGraph and variables into a
``tf.compat.v1.Session``. The signature's graph is then frozen (variables become constants),
optimized by grappler as tf2onnx does, and converted; that session is the reference.

Input shapes come from the source (Keras inputs, the signature); ``options.input_shapes`` fixes or
names dims it leaves open and ``options.dynamic_axes`` opens or names dims. The leading unknown dim
of a Keras input is named ``batch``; other unknown input dims become ``<input>_<axis>``.
tf2onnx's ``unk__N`` names on outputs and inner values are dropped, and ONNX shape inference (run
by ``ferry.convert``) fills them in again from the inputs.

tf2onnx keeps converting past ops it cannot map and leaves them in the graph as TensorFlow ops;
this converter collects all of them (its log records, and every node left that ONNX does not know)
and raises one :class:`UnsupportedOpError` that lists every op type and node.

This module holds the converter and the loading of each kind of source; beside it,
``_tensorflow_load`` imports the libraries and reads files, ``_tensorflow_sources`` reduces a source
to a function (inputs, examples, reference), and ``_tensorflow_export`` runs tf2onnx and fixes the
result's interface.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ferry.converters._base import (
    Converted,
    ConvertOptions,
    exporter_opset,
    first_line,
    type_modules,
)
from ferry.converters._tensorflow_export import (
    _fix_interface,
    _raise_unsupported,
    _run_tf2onnx,
    _run_tf2onnx_graph,
    _Tf2onnxLog,
)
from ferry.converters._tensorflow_load import (
    _SAVED_MODEL_FILES,
    _file_kind,
    _import_backend,
    _load_keras_file,
    _quiet_tensorflow,
    _saved_model_tags,
)
from ferry.converters._tensorflow_sources import (
    _apply_shapes,
    _describe_inputs,
    _from_concrete,
    _from_function,
    _from_keras,
    _GraphSession,
    _Input,
    _make_reference,
    _sample_inputs,
    _Source,
    _spec,
    _tf_name,
    _unique,
)
from ferry.errors import ConversionError, ModelLoadError

__all__ = ["DEFAULT_OPSET", "DEFAULT_SIGNATURE", "TensorFlowConverter"]

logger = logging.getLogger(__name__)

#: The default-domain opset tf2onnx is asked for when the user names none; ONNX Runtime 1.14+,
#: onnxruntime-web and the mobile builds all run it.
DEFAULT_OPSET = 17
#: The SavedModel signature converted unless another is named.
DEFAULT_SIGNATURE = "serving_default"


class TensorFlowConverter:
    """Keras models (Keras 3 and tf_keras), ``.keras``/``.h5`` files, SavedModel folders,
    tf.functions and ConcreteFunctions, converted with tf2onnx.

    Args:
        signature: the SavedModel signature to convert; when the SavedModel has no signature by
            that name but exactly one other, that one is used.
    """

    name = "tensorflow"
    extra = "tensorflow"
    suffixes = (".keras", ".h5", ".hdf5")

    def __init__(self, signature: str = DEFAULT_SIGNATURE) -> None:
        self.signature = signature

    def sniff(self, path: Path) -> bool:
        """A SavedModel folder (``saved_model.pb``), a ``.keras`` zip (``config.json`` inside) or
        an HDF5 file (by magic bytes, whatever its suffix)."""
        path = Path(path)
        if path.is_dir():
            return any((path / f).is_file() for f in _SAVED_MODEL_FILES)
        kind = _file_kind(path)
        return kind is not None

    def accepts(self, obj: object) -> bool:
        """A Keras model or layer, a tf.function, a ConcreteFunction, or a tf.Module such as a
        loaded SavedModel: callable objects (or ones with signatures) whose classes come from
        keras, tf_keras or tensorflow. Imports nothing."""
        if isinstance(obj, (str, os.PathLike)):
            return False
        modules = type_modules(obj)
        if not any("keras" in m or m == "tensorflow" for m in modules):
            return False
        return callable(obj) or bool(getattr(obj, "signatures", None))

    def convert(self, source: Path | object, options: ConvertOptions) -> Converted:
        """Convert a Keras model, a SavedModel, or a TensorFlow function.

        Raises:
            BackendUnavailableError: TensorFlow or tf2onnx is not installed, or Keras runs on
                another backend.
            ModelLoadError: the file or folder is not a model Keras/TensorFlow can load.
            InvalidInputError: input shapes, dynamic axes or example inputs do not fit the model.
            ConversionError: TensorFlow cannot trace the model, or tf2onnx fails.
            UnsupportedOpError: ops tf2onnx cannot convert, every one of them.
        """
        tf, tf2onnx = _import_backend()
        notes: list[str] = []
        if isinstance(source, (str, os.PathLike)):
            src = self._load_path(Path(source), options, notes)
        else:
            src = self._from_object(source, options, notes)
        inputs, symbols = _apply_shapes(src, options)
        sample = _sample_inputs(inputs, options, notes)
        opset = _opset(tf2onnx, options.opset, notes)

        if src.graph is not None:
            output_order = list(src.graph.fetches)
            tf_graph = src.graph.session.graph
            with _Tf2onnxLog() as log:
                try:
                    proto = _run_tf2onnx_graph(tf, tf2onnx, src, inputs, opset)
                except Exception as e:  # tf2onnx and TensorFlow raise plain Exceptions
                    raise ConversionError(
                        f"tf2onnx failed to convert {src.label}: {type(e).__name__}: "
                        f"{first_line(e)}"
                    ) from e
        else:
            specs = [_spec(tf, i) for i in inputs]
            fn = tf.function(src.call, input_signature=specs)
            try:
                concrete = fn.get_concrete_function(*specs)
            except Exception as e:  # whatever the model's own code raises while tracing
                raise ConversionError(
                    f"TensorFlow cannot trace {src.label} for inputs {_describe_inputs(inputs)}: "
                    f"{type(e).__name__}: {first_line(e)}; pass input_shapes (or example_inputs) "
                    "that the model accepts"
                ) from e
            output_order = [str(k) for k in concrete.structured_outputs]
            tf_graph = concrete.graph

            with _Tf2onnxLog() as log:
                try:
                    proto = _run_tf2onnx(tf, tf2onnx, concrete, src.owner, opset)
                except Exception as e:  # tf2onnx raises plain Exceptions of every kind
                    hint = (
                        "; models above 2 GB of weights are not supported yet by ferry's "
                        "TensorFlow converter (convert with python -m tf2onnx.convert "
                        "--large_model)"
                        if "2GB" in str(e) or "string too long" in str(e)
                        else ""
                    )
                    raise ConversionError(
                        f"tf2onnx failed to convert {src.label}: {type(e).__name__}: "
                        f"{first_line(e)}{hint}"
                    ) from e

        import onnx_ir as ir

        model = ir.from_proto(proto)
        _raise_unsupported(model, log.records, src.label, opset, tf_graph)
        _fix_interface(model, inputs, output_order, symbols, src.batch_first)
        reference = _make_reference(tf, src, inputs)
        logger.debug("converted %s: %d nodes at opset %d", src.label, len(model.graph), opset)
        return Converted(model=model, reference=reference, sample_inputs=sample, notes=notes)

    # --- sources -------------------------------------------------------------------------------

    def _load_path(self, path: Path, options: ConvertOptions, notes: list[str]) -> _Source:
        if path.is_dir():
            if not any((path / f).is_file() for f in _SAVED_MODEL_FILES):
                raise ModelLoadError(
                    f"{path} is a folder without saved_model.pb: the TensorFlow converter reads "
                    "SavedModel folders, .keras and .h5 files"
                )
            return self._from_saved_model(path, notes)
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {path}")
        model = _load_keras_file(path, options)
        return _from_keras(model, str(path), options, notes)

    def _from_saved_model(self, path: Path, notes: list[str]) -> _Source:
        import tensorflow as tf

        try:
            loaded = tf.saved_model.load(str(path))
        except Exception as e:  # protobuf parse errors, missing variables, unknown custom ops
            # TF2 revives the saved Python objects (Keras layers, optimizers) and fails on the
            # ones today's classes no longer match; the TF1 loader needs only the graph and the
            # variables, which every SavedModel has.
            try:
                src = self._from_saved_graph(path, notes)
            except ModelLoadError as v1:
                raise ModelLoadError(
                    f"cannot load the SavedModel {path}: {type(e).__name__}: {first_line(e)}; "
                    f"nor with the TF1 loader: {v1} (a model with custom ops needs their library "
                    "loaded, tf.load_op_library, first)"
                ) from e
            notes.append(
                f"TensorFlow's object loader cannot restore {path} ({type(e).__name__}: "
                f"{first_line(e, limit=120)}); it was loaded with the TF1 loader "
                "(tf.compat.v1.saved_model.loader) and converted from the frozen graph of its "
                "signature, verified against that session"
            )
            return src
        return self._from_signatures(loaded, str(path), notes)

    def _from_saved_graph(self, path: Path, notes: list[str]) -> _Source:
        """A SavedModel's MetaGraph loaded in a TF1 session; one signature of it.

        Raises:
            ModelLoadError: the TF1 loader cannot load it, or the signature is missing or has
                inputs other than dense tensors.
        """
        import tensorflow as tf

        tags = _saved_model_tags(path)
        graph = tf.Graph()
        session = tf.compat.v1.Session(graph=graph)
        try:
            with graph.as_default(), _quiet_tensorflow():
                meta_graph = tf.compat.v1.saved_model.loader.load(session, tags, str(path))
        except Exception as e:  # missing variables, unknown ops, a tag set that is not there
            session.close()
            raise ModelLoadError(f"{type(e).__name__}: {first_line(e)}") from e
        try:
            return self._signature_of(session, meta_graph, path, notes)
        except Exception:
            session.close()
            raise

    def _signature_of(self, session: Any, meta_graph: Any, path: Path, notes: list[str]) -> _Source:
        import tensorflow as tf

        label = f"{path} (TF1 graph)"
        signatures = {k: v for k, v in meta_graph.signature_def.items() if not k.startswith("__")}
        if not signatures:
            raise ModelLoadError(f"{label} has no signatures, and the converter converts one")
        key = self._pick_signature(list(signatures), label, notes)
        signature = signatures[key]
        keys = sorted(signature.inputs)
        inputs = []
        for i, name in enumerate(keys):
            info = signature.inputs[name]
            if not info.name:
                raise ModelLoadError(
                    f"{label}: input {name!r} of signature {key!r} is a sparse or composite "
                    "tensor; the TensorFlow converter converts dense inputs only"
                )
            dims = (
                None
                if info.tensor_shape.unknown_rank
                else [None if d.size < 0 else int(d.size) for d in info.tensor_shape.dim]
            )
            inputs.append(_Input(_tf_name(name, i, len(keys)), tf.as_dtype(info.dtype), dims))
        _unique(inputs, label)
        fetches: dict[str, str] = {}
        for name in sorted(signature.outputs):
            info = signature.outputs[name]
            if not info.name:
                raise ModelLoadError(
                    f"{label}: output {name!r} of signature {key!r} is a sparse or composite "
                    "tensor; the TensorFlow converter converts dense outputs only"
                )
            fetches[name] = info.name
        run = _GraphSession(session, [signature.inputs[k].name for k in keys], fetches)

        def call(*arrays: Any) -> dict[str, Any]:
            feed = dict(zip(run.feeds, arrays))
            return dict(session.run(run.fetches, feed_dict=feed))

        return _Source(
            f"{path} (signature {key!r}, TF1 graph)",
            inputs,
            call,
            batch_first=False,
            owner=session,
            graph=run,
        )

    def _pick_signature(self, keys: Sequence[str], label: str, notes: list[str]) -> str:
        if self.signature in keys:
            return self.signature
        if len(keys) == 1:
            notes.append(f"{label} has no signature {self.signature!r}; converted {keys[0]!r}")
            return keys[0]
        raise ModelLoadError(
            f"{label} has no signature {self.signature!r}; it has {sorted(keys)}: "
            "choose one with TensorFlowConverter(signature=...)"
        )

    def _from_signatures(self, obj: Any, label: str, notes: list[str]) -> _Source:
        signatures = dict(getattr(obj, "signatures", None) or {})
        if not signatures:
            raise ModelLoadError(
                f"{label} has no signatures, and the TensorFlow converter converts one: save it "
                "with tf.saved_model.save(obj, path, signatures=obj.f.get_concrete_function(...))"
            )
        key = self._pick_signature(list(signatures), label, notes)
        src = _from_concrete(signatures[key], f"{label} (signature {key!r})")
        src.owner = obj
        return src

    def _from_object(self, obj: Any, options: ConvertOptions, notes: list[str]) -> _Source:
        import tensorflow as tf

        name = getattr(obj, "name", None) or getattr(obj, "__name__", None)
        kind = "tf.function" if callable(getattr(obj, "get_concrete_function", None)) else None
        label = f"the {kind or type(obj).__name__}" + (f" {name!r}" if name else "")
        modules = type_modules(obj)
        if "keras" in modules or "tf_keras" in modules:
            return _from_keras(obj, None, options, notes)
        if isinstance(obj, tf.types.experimental.ConcreteFunction):
            return _from_concrete(obj, label)
        if isinstance(obj, tf.types.experimental.PolymorphicFunction):
            return _from_function(obj, label, options)
        if getattr(obj, "signatures", None):
            return self._from_signatures(obj, label, notes)
        # A tf.Module whose __call__ is a tf.function (not merely callable: that is any object).
        if (
            isinstance(obj, tf.Module)
            and callable(obj)
            and isinstance(obj.__call__, tf.types.experimental.PolymorphicFunction)
        ):
            src = _from_function(obj.__call__, label, options)
            src.owner = obj
            return src
        raise ModelLoadError(
            f"{label} is not something the TensorFlow converter reads: pass a Keras model, a "
            "tf.function (with an input_signature, or input_shapes), a ConcreteFunction, or a "
            "SavedModel (folder or tf.saved_model.load object)"
        )


def _opset(tf2onnx: Any, requested: int | None, notes: list[str]) -> int:
    newest = int(max(tf2onnx.constants.OPSET_TO_IR_VERSION))
    if requested is None:
        return min(DEFAULT_OPSET, newest)
    return exporter_opset(requested, notes, exporter="tf2onnx", newest=newest)
