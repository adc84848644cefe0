"""TensorFlow files and libraries, for the TensorFlow converter: importing TensorFlow, tf2onnx and
Keras (``keras`` or ``tf_keras``) with their logs quietened, telling a Keras archive, a legacy
``.h5`` file and a SavedModel folder apart, and loading Keras files with errors that say which
Keras wrote them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ferry.converters._base import ConvertOptions, first_line
from ferry.errors import BackendUnavailableError, ModelLoadError

__all__: list[str] = []

logger = logging.getLogger(__name__)

_INSTALL = "pip install 'ferry[tensorflow]'"
_ZIP_MAGIC = b"PK\x03\x04"
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_HDF5_SUFFIXES = (".h5", ".hdf5")
_SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
_KERAS_ARCHIVE_FILES = ("config.json", "metadata.json")


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
