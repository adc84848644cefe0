"""Read a ``.tflite`` flatbuffer into plain dataclasses.

The flatbuffer is walked once, eagerly, through the classes of the ``tflite`` package (generated
from TFLite's ``schema.fbs``, pure Python). Reading eagerly means a corrupt or truncated file fails
here, with the file named, rather than halfway through the translation; the constant buffers are
kept as zero-copy numpy views of the file's bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import struct
from typing import Any

import numpy as np

from ferry.errors import BackendUnavailableError, ModelLoadError

__all__ = [
    "FILE_IDENTIFIER",
    "Model",
    "Operator",
    "Quant",
    "Sparsity",
    "Subgraph",
    "Tensor",
    "has_identifier",
    "read_model",
]

#: The flatbuffer file identifier every ``.tflite`` file carries at bytes 4..8.
FILE_IDENTIFIER = b"TFL3"

# TFLite TensorType -> numpy dtype. INT4 is stored packed (two per byte) and unpacked on read.
_NUMPY_TYPES: dict[int, np.dtype[Any]] = {
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
    17: np.dtype("i1"),  # INT4, unpacked to one value per byte
}

#: TFLite TensorType codes by name, for messages.
TYPE_NAMES = {
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
    17: "int4",
    18: "bfloat16",
}

INT4 = 17


@dataclasses.dataclass(frozen=True)
class Quant:
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


@dataclasses.dataclass(frozen=True)
class DimMetadata:
    """One dimension of a sparse tensor: dense, or compressed (CSR) by segments and indices."""

    dense: bool
    dense_size: int
    segments: np.ndarray | None
    indices: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class Sparsity:
    """How a constant tensor's values are stored compressed (TFLite's TACO-style format)."""

    traversal_order: tuple[int, ...]
    block_map: tuple[int, ...]
    dims: tuple[DimMetadata, ...]


@dataclasses.dataclass
class Tensor:
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
    """

    index: int
    name: str
    type: int
    shape: tuple[int, ...]
    signature: tuple[int, ...] | None
    data: np.ndarray | None
    quant: Quant | None
    is_variable: bool
    sparsity: Sparsity | None
    has_rank: bool = True
    opaque: bool = False

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, f"type {self.type}")

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
class Operator:
    """A TFLite operator.

    Attributes:
        index: its position in the subgraph (the execution order).
        opcode: the builtin op's name (``"CONV_2D"``), or ``"CUSTOM"``.
        custom_code: the custom op's name, for ``CUSTOM``.
        version: the op's version in the file.
        inputs: tensor indices, -1 for an omitted optional input.
        outputs: tensor indices.
        options: the builtin options as a dict with the schema's snake_case field names.
        custom_options: the custom op's raw options.
    """

    index: int
    opcode: str
    custom_code: str | None
    version: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: dict[str, Any]
    custom_options: bytes | None

    @property
    def display_name(self) -> str:
        """``CONV_2D`` or ``CUSTOM(Name)``: how the op is named to the user."""
        return f"CUSTOM({self.custom_code})" if self.opcode == "CUSTOM" else self.opcode


@dataclasses.dataclass
class Subgraph:
    """A TFLite subgraph: its tensors, operators and the indices of its inputs and outputs."""

    index: int
    name: str
    tensors: list[Tensor]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    operators: list[Operator]


@dataclasses.dataclass
class Model:
    """A TFLite model."""

    version: int
    description: str
    subgraphs: list[Subgraph]


def has_identifier(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts like a TFLite flatbuffer (the ``TFL3`` file identifier)."""
    return len(data) >= 8 and bytes(data[4:8]) == FILE_IDENTIFIER


def read_model(data: bytes, source: str) -> Model:
    """Parse a TFLite flatbuffer.

    Args:
        data: the file's bytes.
        source: the file's name (or a description of the in-memory bytes), for messages.

    Raises:
        ModelLoadError: ``data`` is not a TFLite flatbuffer, or is corrupt or truncated.
        BackendUnavailableError: the ``tflite`` schema package is not installed.
    """
    if not has_identifier(data):
        raise ModelLoadError(
            f"{source} is not a TFLite model: it lacks the 'TFL3' flatbuffer identifier "
            "at bytes 4..8"
        )
    schema = _schema()
    try:
        return _Reader(schema, data).model()
    except ModelLoadError:
        raise
    except (IndexError, ValueError, TypeError, struct.error, UnicodeDecodeError) as e:
        # The generated accessors trust every offset in the file; a corrupt one surfaces as one
        # of these while unpacking.
        raise ModelLoadError(
            f"{source} is a corrupt or truncated TFLite flatbuffer ({type(e).__name__}: {e}); "
            "re-export the model"
        ) from e


def _schema() -> Any:
    try:
        import tflite
    except ImportError as e:
        raise BackendUnavailableError(
            "reading .tflite files needs the 'tflite' schema package: pip install 'ferry[tflite]'"
        ) from e
    return tflite


class _Reader:
    def __init__(self, schema: Any, data: bytes) -> None:
        self.schema = schema
        self.data = data
        self.root = schema.Model.GetRootAs(data, 0)
        self.builtin_names = _builtin_names(schema)
        self.options_classes = _options_classes(schema)
        self._buffers: dict[int, np.ndarray | None] = {}

    def model(self) -> Model:
        root = self.root
        codes = [self._opcode(root.OperatorCodes(i)) for i in range(root.OperatorCodesLength())]
        subgraphs = [self._subgraph(i, codes) for i in range(root.SubgraphsLength())]
        if not subgraphs:
            raise ModelLoadError("the TFLite model has no subgraph")
        description = root.Description()
        return Model(
            version=int(root.Version()),
            description=description.decode("utf-8", "replace") if description else "",
            subgraphs=subgraphs,
        )

    def _opcode(self, code: Any) -> tuple[str, str | None, int]:
        # Codes above 127 live in builtin_code; older files only fill deprecated_builtin_code.
        number = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
        name = self.builtin_names.get(number, f"BUILTIN_{number}")
        custom = code.CustomCode()
        return name, custom.decode("utf-8", "replace") if custom else None, int(code.Version())

    def _subgraph(self, index: int, codes: list[tuple[str, str | None, int]]) -> Subgraph:
        sg = self.root.Subgraphs(index)
        tensors = [self._tensor(sg.Tensors(i), i) for i in range(sg.TensorsLength())]
        count = len(tensors)
        operators = []
        for i in range(sg.OperatorsLength()):
            op = sg.Operators(i)
            code_index = int(op.OpcodeIndex())
            if not 0 <= code_index < len(codes):
                raise ModelLoadError(f"operator {i} has opcode index {code_index} out of range")
            name, custom, version = codes[code_index]
            inputs = _ints(op.InputsAsNumpy())
            outputs = _ints(op.OutputsAsNumpy())
            for t in (*inputs, *outputs):
                if not -1 <= t < count:
                    raise ModelLoadError(f"operator {i} ({name}) names tensor {t} out of range")
            custom_options = None
            if op.CustomOptionsLength():
                custom_options = op.CustomOptionsAsNumpy().tobytes()
            elif op.LargeCustomOptionsSize():
                start = int(op.LargeCustomOptionsOffset())
                custom_options = self.data[start : start + int(op.LargeCustomOptionsSize())]
            operators.append(
                Operator(
                    index=i,
                    opcode=name,
                    custom_code=custom,
                    version=version,
                    inputs=inputs,
                    outputs=outputs,
                    options=self._options(op),
                    custom_options=custom_options,
                )
            )
        inputs = _ints(sg.InputsAsNumpy())
        outputs = _ints(sg.OutputsAsNumpy())
        for t in (*inputs, *outputs):
            if not 0 <= t < count:
                raise ModelLoadError(f"subgraph {index} names tensor {t} out of range")
        name = sg.Name()
        return Subgraph(
            index=index,
            name=name.decode("utf-8", "replace") if name else "",
            tensors=tensors,
            inputs=inputs,
            outputs=outputs,
            operators=operators,
        )

    def _tensor(self, t: Any, index: int) -> Tensor:
        name = t.Name()
        shape = _ints(t.ShapeAsNumpy())
        signature = _ints(t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else None
        ttype = int(t.Type())
        sparsity = self._sparsity(t.Sparsity())
        raw = self._buffer(int(t.Buffer()))
        data = None
        opaque = False
        if raw is not None and raw.size:
            if ttype in _NUMPY_TYPES:
                data = _decode(raw, ttype, shape, sparse=sparsity is not None, index=index)
            else:  # strings, resources...: only an op that reads it can say whether it matters
                opaque = True
        return Tensor(
            index=index,
            name=name.decode("utf-8", "replace") if name else f"tensor_{index}",
            type=ttype,
            shape=shape,
            signature=signature,
            data=data,
            quant=self._quant(t.Quantization()),
            is_variable=bool(t.IsVariable()),
            sparsity=sparsity,
            has_rank=bool(t.HasRank()) or bool(shape),
            opaque=opaque,
        )

    def _buffer(self, index: int) -> np.ndarray | None:
        if index in self._buffers:
            return self._buffers[index]
        root = self.root
        if not 0 <= index < root.BuffersLength():
            raise ModelLoadError(f"a tensor names buffer {index} out of range")
        buf = root.Buffers(index)
        data: np.ndarray | None = None
        offset = int(buf.Offset())
        if offset > 1:
            # Models past 2 GB keep their weights after the flatbuffer, addressed by offset/size.
            size = int(buf.Size())
            if offset + size > len(self.data):
                raise ModelLoadError(f"buffer {index} lies past the end of the file")
            data = np.frombuffer(self.data, np.uint8, size, offset)
        elif buf.DataLength():
            data = buf.DataAsNumpy()
        self._buffers[index] = data
        return data

    def _quant(self, q: Any) -> Quant | None:
        if q is None or not q.ScaleLength():
            return None
        scale = np.asarray(q.ScaleAsNumpy(), dtype=np.float32).reshape(-1)
        zero = (
            np.asarray(q.ZeroPointAsNumpy(), dtype=np.int64).reshape(-1)
            if q.ZeroPointLength()
            else np.zeros(scale.shape, np.int64)
        )
        if zero.size == 1 and scale.size > 1:
            zero = np.full(scale.shape, zero[0], np.int64)
        if zero.size != scale.size:
            raise ModelLoadError(
                f"quantization has {scale.size} scales but {zero.size} zero points"
            )
        return Quant(scale=scale, zero_point=zero, axis=int(q.QuantizedDimension()))

    def _sparsity(self, s: Any) -> Sparsity | None:
        if s is None:
            return None
        dims = []
        for i in range(s.DimMetadataLength()):
            d = s.DimMetadata(i)
            dense = int(d.Format()) == 0
            dims.append(
                DimMetadata(
                    dense=dense,
                    dense_size=int(d.DenseSize()),
                    segments=None
                    if dense
                    else self._index_vector(int(d.ArraySegmentsType()), d.ArraySegments()),
                    indices=None
                    if dense
                    else self._index_vector(int(d.ArrayIndicesType()), d.ArrayIndices()),
                )
            )
        return Sparsity(
            traversal_order=_ints(s.TraversalOrderAsNumpy()),
            block_map=_ints(s.BlockMapAsNumpy()),
            dims=tuple(dims),
        )

    def _index_vector(self, kind: int, table: Any) -> np.ndarray:
        # A union of Int32Vector / Uint16Vector / Uint8Vector, told apart by its type code.
        classes = {1: "Int32Vector", 2: "Uint16Vector", 3: "Uint8Vector"}
        if table is None or kind not in classes:
            raise ModelLoadError("a sparse tensor dimension has no segment or index vector")
        vector = getattr(self.schema, classes[kind])()
        vector.Init(table.Bytes, table.Pos)
        values = vector.ValuesAsNumpy()
        if isinstance(values, int):  # absent vector
            return np.zeros(0, dtype=np.int64)
        return np.asarray(values, dtype=np.int64)

    def _options(self, op: Any) -> dict[str, Any]:
        kind = int(op.BuiltinOptionsType())
        if kind == 0:
            return {}
        cls = self.options_classes.get(kind)
        table = op.BuiltinOptions()
        if cls is None or table is None:
            return {}
        obj = cls()
        obj.Init(table.Bytes, table.Pos)
        return {name: _plain(getter(obj)) for name, getter in _fields(cls)}


def _decode(
    raw: np.ndarray, ttype: int, shape: tuple[int, ...], *, sparse: bool, index: int
) -> np.ndarray:
    """The constant's values from its buffer bytes, shaped (sparse ones stay flat)."""
    dtype = _NUMPY_TYPES[ttype]
    count = int(np.prod(shape)) if shape else 1
    if ttype == INT4:
        packed = raw.view(np.uint8)
        low = (packed & 0x0F).astype(np.int8)
        high = (packed >> 4).astype(np.int8)
        values = np.stack([low, high], axis=-1).reshape(-1)
        values = np.where(values > 7, values - 16, values).astype(np.int8)
        return values[:count] if sparse else values[:count].reshape(shape)
    if raw.size % dtype.itemsize:
        raise ModelLoadError(
            f"tensor {index}: its buffer holds {raw.size} bytes, not a whole number of "
            f"{dtype.name} values"
        )
    values = np.frombuffer(raw.tobytes() if not raw.flags.c_contiguous else raw, dtype=dtype)
    if sparse:
        return values
    if values.size != count:
        raise ModelLoadError(
            f"tensor {index}: its buffer holds {values.size} values but its shape "
            f"{list(shape)} needs {count}"
        )
    return values.reshape(shape)


def _ints(values: Any) -> tuple[int, ...]:
    # The generated *AsNumpy accessors return 0 (not an empty array) for an absent vector.
    if isinstance(values, int):
        return ()
    return tuple(int(v) for v in values)


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


@functools.lru_cache(maxsize=1)
def _builtin_names(schema: Any) -> dict[int, str]:
    ops = schema.BuiltinOperator
    return {v: k for k, v in vars(ops).items() if not k.startswith("_") and isinstance(v, int)}


@functools.lru_cache(maxsize=1)
def _options_classes(schema: Any) -> dict[int, type]:
    union = schema.BuiltinOptions
    classes = {}
    for name, code in vars(union).items():
        if name.startswith("_") or not isinstance(code, int) or code == 0:
            continue
        cls = getattr(schema, name, None)
        if isinstance(cls, type):
            classes[code] = cls
    return classes


_SKIP = {"Init", "GetRootAs"}


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """(snake_case name, getter) for every field of a generated options class.

    Scalar fields are methods taking only ``self``; vector fields come as ``X(j)`` with
    ``XAsNumpy()`` and ``XLength()``, read whole through ``XAsNumpy``.
    """
    fields = []
    members = dict(inspect.getmembers(cls, inspect.isfunction))
    for name, fn in members.items():
        if name.startswith("_") or name in _SKIP or name.startswith("GetRootAs"):
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
    # DilationHFactor -> dilation_h_factor, as the schema spells the field.
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
