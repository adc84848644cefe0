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
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ferry.converters._base import (
    DEFAULT_BATCH,
    Converted,
    ConvertOptions,
    ReferenceFn,
    as_array,
    check_input_options,
    describe_feeds,
    example_items,
    exporter_opset,
    first_line,
    list_ops,
    name_examples,
    require_inputs,
    type_modules,
)
from ferry.errors import (
    BackendUnavailableError,
    ConversionError,
    ExecutionError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)

__all__ = ["DEFAULT_OPSET", "DEFAULT_SIGNATURE", "TensorFlowConverter"]

logger = logging.getLogger(__name__)

#: The default-domain opset tf2onnx is asked for when the user names none; ONNX Runtime 1.14+,
#: onnxruntime-web and the mobile builds all run it.
DEFAULT_OPSET = 17
#: The SavedModel signature converted unless another is named.
DEFAULT_SIGNATURE = "serving_default"

_INSTALL = "pip install 'ferry[tensorflow]'"
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_ZIP_MAGIC = b"PK\x03\x04"
_SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
_KERAS_ARCHIVE_FILES = ("config.json", "metadata.json")
_HDF5_SUFFIXES = (".h5", ".hdf5")
# TensorFlow op names: what a placeholder may be called.
_TF_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\-]*")
# The names tf2onnx gives dims it knows nothing about.
_TF2ONNX_DIM = re.compile(r"unk__\d+")
# ORT's contrib ops: tf2onnx emits them only for extra opsets it is asked for, and ORT runs them.
_RUNNABLE_CUSTOM_DOMAINS = ("com.microsoft",)


@dataclasses.dataclass
class _Input:
    """One input of the converted model, as TensorFlow sees it."""

    name: str
    dtype: Any  # tf.DType
    #: Dims, None where open; None for an unknown rank.
    dims: list[int | None] | None


@dataclasses.dataclass
class _Source:
    """A source reduced to a function of positional tensors returning ``{output: tensor}``."""

    label: str
    inputs: list[_Input]
    call: Callable[..., dict[str, Any]]
    #: Keras models are batch-first: the leading open dim of every input is the batch.
    batch_first: bool
    #: The trackable object the function belongs to (Keras model, loaded SavedModel, tf.Module):
    #: tf2onnx reads its lookup tables, and holding it keeps a SavedModel's variables alive.
    owner: Any = None
    #: Set for a SavedModel loaded by the TF1 loader: its graph, run by a session (``call`` then
    #: takes numpy arrays and cannot be traced).
    graph: _GraphSession | None = None


@dataclasses.dataclass
class _GraphSession:
    """One signature of a TF1 graph loaded in a ``tf.compat.v1.Session``."""

    session: Any
    #: The graph tensor fed for each input, in the order of ``_Source.inputs``.
    feeds: list[str]
    #: Output key -> the graph tensor it fetches, in output order.
    fetches: dict[str, str]


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


# --- loading ---------------------------------------------------------------------------------


def _import_backend() -> tuple[Any, Any]:
    if "tensorflow" not in sys.modules:
        # TensorFlow's C++ INFO lines (two per grappler run tf2onnx starts) drown the CLI's
        # output; a level the user set is kept.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from ferry.converters._base import native_stderr_to_log

    try:
        # TensorFlow's native code prints oneDNN notices on import, whatever the log level.
        with native_stderr_to_log(logger):
            import tensorflow as tf
    except ImportError as e:
        raise BackendUnavailableError(
            f"converting TensorFlow/Keras models needs TensorFlow ({e}): {_INSTALL}"
        ) from e
    try:
        with native_stderr_to_log(logger):
            import tf2onnx
            import tf2onnx.convert  # the submodule is not imported by the package
    except ImportError as e:
        raise BackendUnavailableError(
            f"converting TensorFlow/Keras models needs tf2onnx ({e}): {_INSTALL}"
        ) from e
    _register_handlers()
    return tf, tf2onnx


def _register_handlers() -> None:
    """Teach tf2onnx the TensorFlow ops current Keras emits that it has no handler for.

    Keras 3's exact GELU (``activation="gelu"``, in every transformer block) computes
    ``0.5 * x * erfc(-x / sqrt(2))``, and tf2onnx 1.17 cannot convert ``Erfc``. A handler tf2onnx
    already has is never replaced.
    """
    from tf2onnx.handler import tf_op

    if _min_opset("Erfc") is None:
        # Erf exists from opset 9. 1 - erf(x) loses erfc's relative precision where erfc(x) is
        # small (x > ~3); the absolute error stays about float32's epsilon, which is what GELU's
        # 0.5 * x * erfc(-x / sqrt(2)) needs.
        tf_op.register_handler(_convert_erfc, 9, ["Erfc"], "", {})


def _convert_erfc(ctx: Any, node: Any, **kwargs: Any) -> None:
    """Before -> After: ``Erfc(x)`` -> ``Sub(1, Erf(x))``."""
    from tf2onnx import utils

    x = node.input[0]
    one = np.array(1, dtype=utils.map_onnx_to_numpy_type(ctx.get_dtype(x)))
    erf = ctx.make_node("Erf", [x], op_name_scope=node.name)
    const = ctx.make_const(utils.make_name(f"{node.name}_one"), one)
    node.type = "Sub"
    ctx.replace_inputs(node, [const.output[0], erf.output[0]])


def _file_kind(path: Path) -> str | None:
    """``"keras"`` (a Keras 3 zip archive), ``"h5"`` (an HDF5 file) or None."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError:
        return None
    if head == _HDF5_MAGIC:
        return "h5"
    if head[:4] == _ZIP_MAGIC:
        try:
            with zipfile.ZipFile(path) as z:
                names = set(z.namelist())
        except (OSError, zipfile.BadZipFile):
            return None
        return "keras" if names & set(_KERAS_ARCHIVE_FILES) else None
    return None


def _load_keras_file(path: Path, options: ConvertOptions) -> Any:
    """Load a ``.keras`` or ``.h5`` file with Keras (``compile=False``: no optimizer state)."""
    kind = _file_kind(path)
    if kind is None:
        expected = (
            "an HDF5 file" if path.suffix.lower() in _HDF5_SUFFIXES else "a Keras zip archive"
        )
        raise ModelLoadError(
            f"{path} is not {expected} holding a model (corrupt, truncated, or another format): "
            "the TensorFlow converter reads .keras archives, .h5 files and SavedModel folders"
        )
    keras = _import_keras()
    suffix = ".keras" if kind == "keras" else ".h5"
    with contextlib.ExitStack() as stack:
        target = path
        if path.suffix.lower() not in ((suffix,) if kind == "keras" else _HDF5_SUFFIXES):
            # Keras picks the format by suffix; a link with the right one leaves the file alone.
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ferry-keras-")))
            target = tmp / f"model{suffix}"
            try:
                target.symlink_to(path.resolve())
            except OSError:  # no symlinks (Windows without the privilege): copy
                shutil.copyfile(path, target)
        try:
            return keras.saving.load_model(
                str(target), compile=False, safe_mode=not options.trust_pickle
            )
        except Exception as e:  # Keras raises ValueError/TypeError/OSError and h5py's own
            raise ModelLoadError(_keras_load_message(path, e, keras.__version__)) from e


def _keras_load_message(path: Path, e: BaseException, version: str) -> str:
    # Keras puts the cause after a long preamble (and the config) in its message, or in the
    # exception's context; search all of it.
    full = f"{e}\n{e.__cause__ or ''}\n{e.__context__ or ''}"
    text = first_line(e)
    if "safe_mode" in full or "unsafe" in full.lower():
        return (
            f"{path} holds Python code (a Lambda layer), which Keras only loads when told to: it "
            "can run arbitrary code. Pass --trust-pickle (CLI) or trust_pickle=True, and only "
            "for a file you trust"
        )
    missing = re.search(r"Could not locate (?:class|function) '([^']+)'", full)
    if missing:
        name = missing.group(1)
        module = re.search(rf"'module': '([^']+)', 'class_name': '{re.escape(name)}'", full)
        where = f" (defined in module {module.group(1)!r})" if module else ""
        return (
            f"cannot load {path}: it uses {name}{where}, a custom class Keras does not know "
            "here. Import the module that defines it, with the class registered through "
            "@keras.saving.register_keras_serializable(), then convert the loaded model"
        )
    if "No model config" in full or "model_config" in full:
        return f"{path} holds weights only, no model: save it with model.save('model.keras')"
    return f"cannot load {path} with Keras {version}: {type(e).__name__}: {text}"


def _import_keras() -> Any:
    try:
        import keras
    except ImportError as e:
        raise BackendUnavailableError(
            f"reading .keras/.h5 files needs Keras ({e}): {_INSTALL}"
        ) from e
    backend = _keras_backend(keras)
    if backend not in (None, "tensorflow"):
        raise BackendUnavailableError(
            f"Keras is running on the {backend!r} backend, and ferry converts Keras models by "
            "tracing them with TensorFlow: set KERAS_BACKEND=tensorflow before Keras is imported"
        )
    return keras


def _keras_backend(keras: Any) -> str | None:
    config = getattr(keras, "config", None)
    get = getattr(config, "backend", None) or getattr(
        getattr(keras, "backend", None), "backend", None
    )
    return str(get()) if callable(get) else None


def _saved_model_tags(path: Path) -> list[str]:
    """The tag set of the SavedModel's MetaGraph to load: the one tagged ``serve``, else the only
    one.

    Raises:
        ModelLoadError: the file is not a SavedModel proto, or which MetaGraph is meant is unclear.
    """
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    try:
        if (path / "saved_model.pb").is_file():
            proto.ParseFromString((path / "saved_model.pb").read_bytes())
        else:
            text_format.Parse((path / "saved_model.pbtxt").read_text(encoding="utf-8"), proto)
    except (OSError, UnicodeDecodeError, message.Error) as e:
        raise ModelLoadError(f"its saved_model.pb cannot be read: {first_line(e)}") from e
    tag_sets = [list(m.meta_info_def.tags) for m in proto.meta_graphs]
    serving = [tags for tags in tag_sets if "serve" in tags]
    if serving:
        return serving[0]
    if len(tag_sets) == 1:
        return tag_sets[0]
    raise ModelLoadError(
        f"it has {len(tag_sets)} MetaGraphs, tagged {tag_sets}, and none is tagged 'serve'"
    )


@contextlib.contextmanager
def _quiet_tensorflow() -> Any:
    """TensorFlow's Python logger at ERROR: the TF1 loader logs deprecation notices (on stderr,
    before the CLI's own output) that say nothing the user can act on."""
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        tf_logger.setLevel(level)


# --- sources reduced to functions ------------------------------------------------------------


def _from_keras(
    model: Any, where: str | None, options: ConvertOptions, notes: list[str]
) -> _Source:
    import tensorflow as tf

    if "keras" in type_modules(model):
        _import_keras()  # refuses a Keras 3 model built on another backend
    model_name = _safe_attr(model, "name")
    what = f"Keras {type(model).__name__}" + (f" {model_name!r}" if model_name else "")
    label = f"{where} ({what})" if where else f"the {what}"
    keys = [k for k, _ in example_items(options.example_inputs) if k is not None]
    keras_inputs = _keras_inputs(model)
    if keras_inputs:
        inputs = [
            _Input(
                _tf_name(_keras_input_name(t), i, len(keras_inputs)),
                tf.as_dtype(_dtype_name(t.dtype)),
                _dims(t.shape),
            )
            for i, t in enumerate(keras_inputs)
        ]
        structure = getattr(model, "input", None) if len(keras_inputs) > 1 else None
        by_name = False
    else:
        # Subclassed models and unbuilt Sequentials know their inputs only once called.
        inputs = _inputs_from_options(options, label, keras=True, notes=notes)
        structure = None
        by_name = bool(keys)
    _unique(inputs, label)
    output_names = [str(n) for n in (_safe_attr(model, "output_names") or [])]
    # A model called with a dict gets the user's own keys, whatever the inputs are named.
    names = keys or [i.name for i in inputs]

    def call(*args: Any) -> dict[str, Any]:
        x = _keras_call_args(tf, args, names, by_name, structure)
        return _name_outputs(tf, model(x, training=False), output_names)

    return _Source(label, inputs, call, batch_first=True, owner=model)


def _keras_call_args(
    tf: Any, args: Sequence[Any], names: Sequence[str], by_name: bool, structure: Any
) -> Any:
    """What the model is called with: one tensor, its input structure, a list or a dict."""
    if by_name:
        return dict(zip(names, args))
    if len(args) == 1:
        return args[0]
    if structure is not None:
        return tf.nest.pack_sequence_as(structure, list(args))
    return list(args)


def _keras_input_name(tensor: Any) -> str | None:
    """The name of the Input layer that made ``tensor``: ``keras.Input(name="image")`` names
    both, but an unnamed Input's tensor is only ``keras_tensor_<n>``, its layer ``input_layer``."""
    history = getattr(tensor, "_keras_history", None)
    layer = getattr(history, "operation", None) or getattr(history, "layer", None)
    name = getattr(layer, "name", None) or getattr(tensor, "name", None)
    return str(name) if name else None


def _keras_inputs(model: Any) -> list[Any]:
    found = _safe_attr(model, "inputs")
    if not found:
        return []
    flat = list(found) if isinstance(found, (list, tuple)) else [found]
    return [t for t in flat if getattr(t, "shape", None) is not None]


def _safe_attr(obj: Any, name: str) -> Any:
    # Keras raises (AttributeError, ValueError) from these properties on models not yet built.
    try:
        return getattr(obj, name, None)
    except Exception:  # any failure just means "not known yet"
        return None


def _from_concrete(fn: Any, label: str) -> _Source:
    """A ConcreteFunction: a SavedModel signature (keyword inputs) or a traced function."""
    args, kwargs = fn.structured_input_signature
    flat_args = list(args)
    if kwargs and not flat_args:
        keys = list(kwargs)
        specs = [kwargs[k] for k in keys]
        inputs = [_input_from_spec(s, k, i, len(keys)) for i, (k, s) in enumerate(zip(keys, specs))]

        def call(*tensors: Any) -> dict[str, Any]:
            import tensorflow as tf

            return _name_outputs(tf, fn(**dict(zip(keys, tensors))), [])

    elif flat_args and not kwargs and all(_is_spec(s) for s in flat_args):
        inputs = [_input_from_spec(s, None, i, len(flat_args)) for i, s in enumerate(flat_args)]

        def call(*tensors: Any) -> dict[str, Any]:
            import tensorflow as tf

            return _name_outputs(tf, fn(*tensors), [])

    else:
        raise ConversionError(
            f"{label} takes nested or mixed inputs {fn.structured_input_signature}; convert a "
            "function of plain tensors (positional or keyword)"
        )
    _unique(inputs, label)
    return _Source(label, inputs, call, batch_first=False)


def _from_function(fn: Any, label: str, options: ConvertOptions) -> _Source:
    """A tf.function: its input_signature, else shapes from the options."""
    signature = getattr(fn, "input_signature", None)
    params = _param_names(fn)
    if signature:
        flat = list(signature)
        if not all(_is_spec(s) for s in flat):
            raise ConversionError(
                f"{label} has a nested input_signature; convert a function of plain tensors"
            )
        inputs = [
            _input_from_spec(s, params[i] if i < len(params) else None, i, len(flat))
            for i, s in enumerate(flat)
        ]
    else:
        inputs = _inputs_from_options(options, label, keras=False, notes=None, params=params)
    _unique(inputs, label)

    def call(*tensors: Any) -> dict[str, Any]:
        import tensorflow as tf

        return _name_outputs(tf, fn(*tensors), [])

    return _Source(label, inputs, call, batch_first=False)


def _param_names(fn: Any) -> list[str]:
    python_function = getattr(fn, "python_function", None)
    if python_function is None:
        return []
    try:
        params = inspect.signature(python_function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]


def _is_spec(obj: Any) -> bool:
    return hasattr(obj, "shape") and hasattr(obj, "dtype") and not hasattr(obj, "numpy")


def _input_from_spec(spec: Any, key: str | None, index: int, count: int) -> _Input:
    name = key or getattr(spec, "name", None)
    return _Input(_tf_name(name, index, count), spec.dtype, _dims(spec.shape))


def _inputs_from_options(
    options: ConvertOptions,
    label: str,
    *,
    keras: bool,
    notes: list[str] | None,
    params: Sequence[str] = (),
) -> list[_Input]:
    """Inputs of a source that does not declare them: from example inputs, else input shapes."""
    import tensorflow as tf

    if options.example_inputs is not None:
        named = example_items(options.example_inputs)
        inputs = []
        for i, (key, value) in enumerate(named):
            arr = as_array(value, key or f"#{i}")
            default = params[i] if i < len(params) else None
            name = _tf_name(key or default, i, len(named))
            dtype = arr.dtype
            if keras and dtype == np.float64:
                # Keras computes in float32 (its default float policy) whatever it is fed.
                dtype = np.dtype(np.float32)
                if notes is not None:
                    notes.append(f"input {name!r}: float64 example fed as float32")
            # The leading dim of an example is a batch of them, not a size to freeze.
            sizes = [int(d) for d in arr.shape]
            dims: list[int | None] = [None, *sizes[1:]] if keras and sizes else [*sizes]
            inputs.append(_Input(name, tf.as_dtype(dtype), dims))
        return inputs
    if options.input_shapes:
        return [
            _Input(_tf_name(str(name), i, len(options.input_shapes)), tf.float32, [None] * len(s))
            for i, (name, s) in enumerate(options.input_shapes.items())
        ]
    raise InvalidInputError(
        f"{label} does not declare its inputs (a subclassed or unbuilt model, or a tf.function "
        "without input_signature): pass example_inputs, or input_shapes such as "
        "{'input': ('batch', 224, 224, 3)} (float32)"
    )


def _dtype_name(dtype: Any) -> Any:
    return getattr(dtype, "name", dtype)


def _dims(shape: Any) -> list[int | None] | None:
    try:
        dims = list(shape)
    except (TypeError, ValueError):  # TensorShape of unknown rank
        return None
    return [None if d is None else int(d) for d in dims]


def _tf_name(name: str | None, index: int, count: int) -> str:
    """A valid TensorFlow placeholder name (the ONNX input name) from a source's input name."""
    if name:
        cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "_", str(name).split(":")[0]).lstrip("_-")
        if _TF_NAME.fullmatch(cleaned):
            return cleaned
    return "input" if count == 1 else f"input_{index}"


def _unique(inputs: list[_Input], label: str) -> None:
    names = [i.name for i in inputs]
    if len(set(names)) != len(names):
        for i, item in enumerate(inputs):
            item.name = f"{item.name}_{i}" if names.count(item.name) > 1 else item.name
        logger.debug("%s: duplicate input names made unique: %s", label, names)


def _name_outputs(tf: Any, result: Any, preferred: Sequence[str]) -> dict[str, Any]:
    """``{name: tensor}`` from whatever the model returned (a tensor, a list, a dict, nested)."""
    if isinstance(result, Mapping) and all(tf.is_tensor(v) for v in result.values()):
        items = [(str(k), v) for k, v in result.items()]
    else:
        flat = tf.nest.flatten(result)
        if len(preferred) == len(flat) and len(set(preferred)) == len(preferred):
            names = list(preferred)
        else:
            names = ["output" if len(flat) == 1 else f"output_{i}" for i in range(len(flat))]
        items = list(zip(names, flat))
    # One tensor returned under two names would come out of the graph once.
    return {name: tf.identity(value) for name, value in items}


# --- shapes and examples ---------------------------------------------------------------------


def _apply_shapes(
    src: _Source, options: ConvertOptions
) -> tuple[list[_Input], dict[tuple[str, int], str]]:
    """Inputs with ``input_shapes``/``dynamic_axes`` applied, and the dims to name symbolically."""
    inputs = [
        dataclasses.replace(i, dims=None if i.dims is None else list(i.dims)) for i in src.inputs
    ]
    by_name = {i.name: i for i in inputs}
    symbols: dict[tuple[str, int], str] = {}
    check_input_options(options, list(by_name), src.label)
    for name, shape in (options.input_shapes or {}).items():
        item = by_name[name]
        dims = list(shape)
        if item.dims is not None and len(dims) != len(item.dims):
            raise InvalidInputError(
                f"input_shapes[{name!r}] = {tuple(dims)} has rank {len(dims)}, but input {name!r} "
                f"of {src.label} has rank {len(item.dims)} ({_shape_text(item.dims)})"
            )
        new: list[int | None] = []
        for axis, d in enumerate(dims):
            have = None if item.dims is None else item.dims[axis]
            if isinstance(d, str) or d is None:
                # A name opens the dim, as dynamic_axes does; the trace decides if the model can.
                if d:
                    symbols[(name, axis)] = d
                new.append(None)
            else:
                size = int(d)
                if have is not None and have != size:
                    raise InvalidInputError(
                        f"input_shapes[{name!r}] sets dim {axis} to {size}, but {src.label} fixes "
                        f"it at {have} ({_shape_text(item.dims)})"
                    )
                new.append(size if size >= 0 else None)
        item.dims = new
    for name, axes in (options.dynamic_axes or {}).items():
        item = by_name[name]
        for axis, symbol in axes.items():
            if item.dims is None or not 0 <= int(axis) < len(item.dims):
                raise InvalidInputError(
                    f"dynamic_axes[{name!r}] names axis {axis}, but input {name!r} has shape "
                    f"{_shape_text(item.dims)}"
                )
            # Tracing with the dim open is what makes the graph work for any size.
            item.dims[int(axis)] = None
            symbols[(name, int(axis))] = str(symbol)
    return inputs, symbols


def _sample_inputs(
    inputs: list[_Input], options: ConvertOptions, notes: list[str]
) -> dict[str, np.ndarray] | None:
    """The example inputs by input name, in the inputs' dtypes, checked against their shapes."""
    if options.example_inputs is None:
        return None
    names = [i.name for i in inputs]
    examples: Any = options.example_inputs
    items = example_items(examples)
    if items and items[0][0] is not None:
        # A key may spell an input as the source does (``image:0``); the input is named after it.
        examples = {k if k in names else _tf_name(k, 0, 1): v for k, v in items}
    by_name = {i.name: i for i in inputs}
    sample: dict[str, np.ndarray] = {}
    for key, value in name_examples(examples, names).items():
        item = by_name[key]
        arr = as_array(value, key)
        want = np.dtype(item.dtype.as_numpy_dtype)
        if arr.dtype != want:
            if not np.can_cast(arr.dtype, want, casting="same_kind"):
                raise InvalidInputError(
                    f"example input {key!r} has dtype {arr.dtype}; the model takes {want}"
                )
            notes.append(f"example input {key!r}: {arr.dtype} cast to {want}")
            arr = arr.astype(want)
        if item.dims is not None and (
            arr.ndim != len(item.dims)
            or any(d is not None and d != s for d, s in zip(item.dims, arr.shape))
        ):
            raise InvalidInputError(
                f"example input {key!r} has shape {arr.shape}; the model takes "
                f"{_shape_text(item.dims)}"
            )
        sample[key] = arr
    return sample


def _spec(tf: Any, item: _Input) -> Any:
    return tf.TensorSpec(item.dims, item.dtype, name=item.name)


def _opset(tf2onnx: Any, requested: int | None, notes: list[str]) -> int:
    newest = int(max(tf2onnx.constants.OPSET_TO_IR_VERSION))
    if requested is None:
        return min(DEFAULT_OPSET, newest)
    return exporter_opset(requested, notes, exporter="tf2onnx", newest=newest)


def _describe_inputs(inputs: Sequence[_Input]) -> str:
    return ", ".join(f"{i.name}: {i.dtype.name}{_shape_text(i.dims)}" for i in inputs)


def _shape_text(dims: Sequence[int | None] | None) -> str:
    if dims is None:
        return "[unknown rank]"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


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


# --- unsupported ops -------------------------------------------------------------------------


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


def _min_opset(op: str) -> int | None:
    """The lowest ONNX opset for which tf2onnx has a handler of ``op``; None when it has none."""
    try:
        from tf2onnx import constants
        from tf2onnx.handler import tf_op
    except ImportError:
        return None
    for version, handlers in enumerate(tf_op.get_opsets().get(constants.ONNX_DOMAIN, [])):
        if op in handlers:
            return version
    return None


def _max_tf2onnx_opset() -> int:
    from tf2onnx import constants

    return int(max(constants.OPSET_TO_IR_VERSION))


# --- the converted model's interface ---------------------------------------------------------


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


# --- reference -------------------------------------------------------------------------------


def _make_reference(tf: Any, src: _Source, inputs: Sequence[_Input]) -> ReferenceFn:
    names = [i.name for i in inputs]
    dtypes = [i.dtype for i in inputs]

    def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        require_inputs(feeds, names, src.label)
        if src.graph is not None:  # a session: numpy arrays in the graph's dtypes
            args = [np.asarray(feeds[n], dtype=d.as_numpy_dtype) for n, d in zip(names, dtypes)]
        else:
            args = [tf.convert_to_tensor(feeds[n], dtype=d) for n, d in zip(names, dtypes)]
        try:
            result = src.call(*args)
        except Exception as e:  # the source's own failure on these inputs
            raise ExecutionError(
                f"{src.label} failed on inputs {describe_feeds(feeds)}: {type(e).__name__}: "
                f"{first_line(e)}"
            ) from e
        return {k: np.asarray(v) for k, v in result.items()}

    return reference
