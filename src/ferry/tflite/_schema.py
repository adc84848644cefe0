"""The TFLite flatbuffer schema (TFLite's ``schema.fbs``): its constants, its generated code, and a
``.tflite`` file in memory.

The ``tflite`` package holds the Python code ``flatc`` generates from ``schema.fbs`` (pure Python,
no TensorFlow): table readers (``tflite.Model.GetRootAs``...) and the builder functions that write
tables (``tflite.ModelStart``...). :func:`tflite_schema` imports it and indexes what reading and
writing look up: builtin operators and builtin option tables, by code and by name, and which options
table each builtin operator takes. The dataclasses are a ``.tflite`` file as plain data: what the
reader returns and the writer takes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ferry.errors import BackendUnavailableError

__all__ = [
    "OPTION_ENUMS",
    "TFLITE_DTYPES",
    "TFLITE_IDENTIFIER",
    "TFLITE_INT4",
    "TFLITE_TYPE_NAMES",
    "OptionField",
    "TFLiteDimMetadata",
    "TFLiteModel",
    "TFLiteOperator",
    "TFLiteQuant",
    "TFLiteSchema",
    "TFLiteSignature",
    "TFLiteSparsity",
    "TFLiteSubgraph",
    "TFLiteTensor",
    "is_tflite",
    "option_fields",
    "option_specs",
    "tflite_schema",
]

#: The flatbuffer file identifier every ``.tflite`` file carries at bytes 4..8.
TFLITE_IDENTIFIER = b"TFL3"

#: The TensorType code of INT4, stored packed (two values a byte).
TFLITE_INT4 = 17

#: TFLite TensorType code -> numpy dtype of the values (INT4 as unpacked, one value a byte).
TFLITE_DTYPES: dict[int, np.dtype[Any]] = {
    0: np.dtype("<f4"),  # FLOAT32
    1: np.dtype("<f2"),  # FLOAT16
    2: np.dtype("<i4"),  # INT32
    3: np.dtype("u1"),  # UINT8
    4: np.dtype("<i8"),  # INT64
    6: np.dtype("?"),  # BOOL
    7: np.dtype("<i2"),  # INT16
    8: np.dtype("<c8"),  # COMPLEX64
    9: np.dtype("i1"),  # INT8
    10: np.dtype("<f8"),  # FLOAT64
    11: np.dtype("<c16"),  # COMPLEX128
    12: np.dtype("<u8"),  # UINT64
    15: np.dtype("<u4"),  # UINT32
    16: np.dtype("<u2"),  # UINT16
    TFLITE_INT4: np.dtype("i1"),
}

#: TFLite TensorType code -> name, for messages.
TFLITE_TYPE_NAMES = {
    0: "float32",
    1: "float16",
    2: "int32",
    3: "uint8",
    4: "int64",
    5: "string",
    6: "bool",
    7: "int16",
    8: "complex64",
    9: "int8",
    10: "float64",
    11: "complex128",
    12: "uint64",
    13: "resource",
    14: "variant",
    15: "uint32",
    16: "uint16",
    TFLITE_INT4: "int4",
    18: "bfloat16",
}


def is_tflite(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts like a TFLite flatbuffer (the ``TFL3`` file identifier)."""
    return len(data) >= 8 and bytes(data[4:8]) == TFLITE_IDENTIFIER


# ------------------------------------------------------------------------- generated code


@dataclasses.dataclass(frozen=True)
class TFLiteSchema:
    """The ``tflite`` package's generated code, indexed.

    Attributes:
        module: the ``tflite`` package: table classes and builder functions.
        builtin_names: BuiltinOperator code -> name (``3`` -> ``"CONV_2D"``).
        builtin_codes: name -> BuiltinOperator code.
        options_classes: BuiltinOptions union code -> the options table's class.
        options_codes: options table name (``"Conv2DOptions"``) -> BuiltinOptions union code.
        options2_classes: BuiltinOptions2 union code (the StableHLO ops' options) -> class.
        options2_codes: options table name -> BuiltinOptions2 union code.
        options_types: builtin operator name -> the name of the options table it takes
            (``"MAX_POOL_2D"`` -> ``"Pool2DOptions"``); operators without options are absent.
    """

    module: Any
    builtin_names: Mapping[int, str]
    builtin_codes: Mapping[str, int]
    options_classes: Mapping[int, type]
    options_codes: Mapping[str, int]
    options2_classes: Mapping[int, type] = dataclasses.field(default_factory=dict)
    options2_codes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    options_types: Mapping[str, str] = dataclasses.field(default_factory=dict)


def tflite_schema() -> TFLiteSchema:
    """The TFLite schema's generated code (the ``tflite`` package), indexed.

    Raises:
        BackendUnavailableError: the ``tflite`` schema package is not installed.
    """
    try:
        import tflite
    except ImportError as e:
        raise BackendUnavailableError(
            "reading .tflite files needs the 'tflite' schema package: pip install 'ferry[tflite]'"
        ) from e
    return _index(tflite)


#: Builtin operators whose options table is not named after them (schema.fbs pairs them in
#: comments and in TFLite's ``flatbuffer_conversions.cc``); the others take ``<Name>Options``.
_SHARED_OPTIONS = {
    "AVERAGE_POOL_2D": "Pool2DOptions",
    "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions",
    "L2_NORMALIZATION": "L2NormOptions",
    "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
    "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions",
    "MEAN": "ReducerOptions",
    "SUM": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions",
    "REDUCE_ALL": "ReducerOptions",
    "RANDOM_STANDARD_NORMAL": "RandomOptions",
    "RANDOM_UNIFORM": "RandomOptions",
    "MULTINOMIAL": "RandomOptions",
}


def _union(module: Any, name: str) -> dict[str, int]:
    union = getattr(module, name, None)
    if union is None:
        return {}
    return {
        k: v for k, v in vars(union).items() if not k.startswith("_") and isinstance(v, int) and v
    }


def _classes(module: Any, codes: Mapping[str, int]) -> dict[int, type]:
    classes = {}
    for name, code in codes.items():
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            classes[code] = cls
    return classes


@functools.lru_cache(maxsize=1)
def _index(module: Any) -> TFLiteSchema:
    ops = vars(module.BuiltinOperator)
    codes = {k: v for k, v in ops.items() if not k.startswith("_") and isinstance(v, int)}
    options = _union(module, "BuiltinOptions")
    options2 = _union(module, "BuiltinOptions2")
    # CONV_2D -> Conv2DOptions, STABLEHLO_CONCATENATE -> StablehloConcatenateOptions: the
    # table named like the op, compared without underscores and case.
    by_key = {n[: -len("Options")].upper(): n for n in (*options, *options2)}
    types = {}
    for op in codes:
        table = _SHARED_OPTIONS.get(op) or by_key.get(op.replace("_", ""))
        if table is not None:
            types[op] = table
    return TFLiteSchema(
        module=module,
        builtin_names={v: k for k, v in codes.items()},
        builtin_codes=codes,
        options_classes=_classes(module, options),
        options_codes=options,
        options2_classes=_classes(module, options2),
        options2_codes=options2,
        options_types=types,
    )


_NOT_FIELDS = {"Init", "GetRootAs"}


@functools.cache
def option_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """``(snake_case name, getter)`` for every field of a generated options table class.

    Scalar fields are methods taking only ``self``; vector fields come as ``X(j)`` with
    ``XAsNumpy()`` and ``XLength()``, read whole through ``XAsNumpy``. The names are spelled as
    ``schema.fbs`` spells the fields (``DilationHFactor`` -> ``dilation_h_factor``).
    """
    fields = []
    members = dict(inspect.getmembers(cls, inspect.isfunction))
    for name, fn in members.items():
        if name.startswith("_") or name in _NOT_FIELDS or name.startswith("GetRootAs"):
            continue
        if name.endswith(("AsNumpy", "Length", "IsNone", "BufferHasIdentifier")):
            continue
        params = list(inspect.signature(fn).parameters)
        if f"{name}AsNumpy" in members:
            getter = members[f"{name}AsNumpy"]
        elif len(params) == 1:
            getter = fn
        else:
            continue  # a vector of tables: no builtin option the translators read has one
        fields.append((_snake(name), getter))
    return tuple(fields)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


@dataclasses.dataclass(frozen=True)
class OptionField:
    """One field of a builtin options table, as the writer needs it.

    Attributes:
        name: the snake_case name, as :func:`option_fields` (and so the reader) spells it.
        method: the generated accessor's name (``DilationHFactor``); the builder functions are
            ``<Table>Add<method>`` and, for vectors, ``<Table>Start<method>Vector``.
        kind: ``"scalar"``, ``"vector"`` (of numbers), ``"string"``, or ``"other"`` (a table,
            or a vector of tables or strings: no builtin option the writer knows has one).
        dtype: the numpy dtype of a scalar or of a vector's elements (``bool`` for booleans).
        default: the schema's default for a scalar (what an absent field reads as).
    """

    name: str
    method: str
    kind: str
    dtype: np.dtype[Any] | None
    default: Any


class _Asked(Exception):
    def __init__(self, kind: str, flags: Any = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.flags = flags


class _Probe:
    """Stands in for a flatbuffer table under a generated accessor, to learn the field's type.

    The generated Python code keeps no type table; each accessor asks its table for the field
    (``Get(Int32Flags, ...)``, ``GetVectorAsNumpy(Float32Flags, ...)``, ``String(...)``), and that
    question is the type. With ``present`` False the accessor returns the schema's default.
    """

    Pos = 0
    Bytes = b""

    def __init__(self, present: bool) -> None:
        self.present = present

    def Offset(self, slot: int) -> int:
        return 4 if self.present else 0

    def Get(self, flags: Any, off: int) -> Any:
        raise _Asked("scalar", flags)

    def GetVectorAsNumpy(self, flags: Any, off: int) -> Any:
        raise _Asked("vector", flags)

    def String(self, off: int) -> Any:
        raise _Asked("string")

    def __getattr__(self, name: str) -> Any:  # Indirect, Vector, Union...: a nested table
        raise _Asked("other")


def _ask(getter: Any, cls: type, present: bool) -> Any:
    obj: Any = object.__new__(cls)  # the generated classes take no arguments and keep _tab
    obj._tab = _Probe(present)
    return getter(obj)


@functools.cache
def option_specs(cls: type) -> tuple[OptionField, ...]:
    """The fields of a generated options table class, typed, in :func:`option_fields`'s order
    and names (what the reader produces is what the writer takes)."""
    members = dict(inspect.getmembers(cls, inspect.isfunction))
    by_name = {_snake(n): n for n in members}
    specs = []
    for name, getter in option_fields(cls):
        method = by_name[name]
        kind, dtype, default = "other", None, None
        try:
            default = _ask(getter, cls, present=False)
            _ask(getter, cls, present=True)
        except _Asked as asked:
            kind = asked.kind
            if asked.flags is not None:
                dtype = np.dtype(asked.flags.name)
        if kind == "vector":
            default = None
        specs.append(OptionField(name, method, kind, dtype, default))
    for method in members:
        # Vectors of tables or strings: X(j) and XLength() but no XAsNumpy; not in option_fields.
        if f"{method}Length" in members and f"{method}AsNumpy" not in members:
            specs.append(OptionField(_snake(method), method, "other", None, None))
    return tuple(specs)


#: Option fields that hold an enum, by field name: the writer also takes the enum's names
#: (``padding="SAME"``, ``fused_activation_function="RELU6"``).
OPTION_ENUMS = {
    "padding": "Padding",
    "fused_activation_function": "ActivationFunctionType",
    "weights_format": "FullyConnectedOptionsWeightsFormat",
    "kernel_type": "LSTMKernelType",
    "combiner": "CombinerType",
    "mode": "MirrorPadMode",
    "in_data_type": "TensorType",
    "out_data_type": "TensorType",
    "output_type": "TensorType",
    "out_type": "TensorType",
    "idx_out_type": "TensorType",
    "quantized_bias_type": "TensorType",
}


# ---------------------------------------------------------------------------- the file as data


@dataclasses.dataclass(frozen=True)
class TFLiteQuant:
    """Affine quantization of a tensor: ``real = scale * (q - zero_point)``.

    Attributes:
        scale: one scale per tensor or per channel (float32, 1-D).
        zero_point: as many zero points as scales (int64, 1-D).
        axis: the channel axis when there is more than one scale (``quantized_dimension``).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1

    def dequantize(self, values: np.ndarray, axis: int | None = None) -> np.ndarray:
        """The real numbers ``values`` stand for, as float32 (computed in float64).

        Args:
            values: the stored integers.
            axis: the channel axis of ``values`` when it is not :attr:`axis` (a transposed copy).
        """
        scale = self.scale.astype(np.float64)
        zero = self.zero_point.astype(np.float64)
        if self.per_channel:
            shape = [1] * values.ndim
            shape[self.axis if axis is None else axis] = -1
            scale = scale.reshape(shape)
            zero = zero.reshape(shape)
        return ((values.astype(np.float64) - zero) * scale).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class TFLiteDimMetadata:
    """One dimension of a sparse tensor: dense, or compressed (CSR) by segments and indices."""

    dense: bool
    dense_size: int
    segments: np.ndarray | None
    indices: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class TFLiteSparsity:
    """How a constant tensor's values are stored compressed (TFLite's TACO-style format)."""

    traversal_order: tuple[int, ...]
    block_map: tuple[int, ...]
    dims: tuple[TFLiteDimMetadata, ...]


@dataclasses.dataclass
class TFLiteTensor:
    """A TFLite tensor.

    Attributes:
        index: its index in the subgraph.
        name: its name (made unique by the translator, not here).
        type: the TFLite TensorType code.
        shape: the static shape as stored; dims that ``signature`` leaves open are placeholders.
        signature: ``shape_signature`` (-1 for an open dim), or None when the file has none.
        data: the constant's values, shaped (None for activations); sparse constants keep
            their compressed values here and describe them in ``sparsity``.
        quant: affine quantization parameters, if any.
        is_variable: a state tensor (LSTM states, variables), zero-initialised.
        sparsity: the compression of a sparse constant.
        has_rank: False when even the rank is unknown.
        opaque: a constant whose values ferry cannot read (strings, resources).
        raw: an opaque constant's buffer bytes, as stored (what writing it back needs).
    """

    index: int
    name: str
    type: int
    shape: tuple[int, ...]
    signature: tuple[int, ...] | None = None
    data: np.ndarray | None = None
    quant: TFLiteQuant | None = None
    is_variable: bool = False
    sparsity: TFLiteSparsity | None = None
    has_rank: bool = True
    opaque: bool = False
    raw: bytes | None = None

    @property
    def type_name(self) -> str:
        return TFLITE_TYPE_NAMES.get(self.type, f"type {self.type}")

    @property
    def dims(self) -> tuple[int | None, ...]:
        """The shape with None for every dim the signature leaves open."""
        if self.signature is None or len(self.signature) != len(self.shape):
            return self.shape
        return tuple(None if s < 0 else d for d, s in zip(self.shape, self.signature))

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclasses.dataclass
class TFLiteOperator:
    """A TFLite operator.

    Attributes:
        index: its position in the subgraph (the execution order).
        opcode: the builtin op's name (``"CONV_2D"``), or ``"CUSTOM"``.
        custom_code: the custom op's name, for ``CUSTOM``.
        version: the op's version in the file; 0 when building a model: the writer then
            gives the least version LiteRT needs for the op and its tensor types.
        inputs: tensor indices, -1 for an omitted optional input.
        outputs: tensor indices.
        options: the builtin options as a dict with the schema's snake_case field names.
        custom_options: the custom op's raw options.
        options_type: the name of the builtin options table (``"Conv2DOptions"``) the file
            holds; None when it holds none, or, when building, to take the op's own table.
        intermediates: tensor indices of the op's intermediate results (quantized LSTMs).
    """

    index: int
    opcode: str
    custom_code: str | None = None
    version: int = 0
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    custom_options: bytes | None = None
    options_type: str | None = None
    intermediates: tuple[int, ...] = ()

    @property
    def display_name(self) -> str:
        """``CONV_2D`` or ``CUSTOM(Name)``: how the op is named to the user."""
        return f"CUSTOM({self.custom_code})" if self.opcode == "CUSTOM" else self.opcode


@dataclasses.dataclass
class TFLiteSubgraph:
    """A TFLite subgraph: its tensors, operators and the indices of its inputs and outputs."""

    index: int
    name: str = ""
    tensors: list[TFLiteTensor] = dataclasses.field(default_factory=list)
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    operators: list[TFLiteOperator] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TFLiteSignature:
    """A SignatureDef: named inputs and outputs of one subgraph, for LiteRT's signature runners.

    Attributes:
        key: the signature's name (``"serving_default"``).
        subgraph: the index of the subgraph it runs.
        inputs: input name -> tensor index in that subgraph, in order.
        outputs: output name -> tensor index in that subgraph, in order.
    """

    key: str
    subgraph: int
    inputs: dict[str, int] = dataclasses.field(default_factory=dict)
    outputs: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TFLiteModel:
    """A TFLite model.

    Attributes:
        version: the schema version (3, the only one LiteRT reads).
        description: free text.
        subgraphs: the subgraphs; the first is the main one.
        signatures: the SignatureDefs.
        metadata: named metadata buffers (``min_runtime_version``...), as bytes.
    """

    version: int = 3
    description: str = ""
    subgraphs: list[TFLiteSubgraph] = dataclasses.field(default_factory=list)
    signatures: list[TFLiteSignature] = dataclasses.field(default_factory=list)
    metadata: dict[str, bytes] = dataclasses.field(default_factory=dict)
