"""Write a TFLite model, held as plain data (:class:`TFLiteModel`), as a ``.tflite`` flatbuffer.

The inverse of :func:`ferry.tflite.read_tflite`: ``read_tflite(write_tflite(m))`` gives back
``m``. The model is checked whole first (tensor indices, constant data against dtype and shape,
option names and types), so a mistake is an :class:`InvalidInputError` naming the subgraph, op
and tensor, never a file LiteRT refuses later. Then it is built (``_writer_build``) with the
``tflite`` package's generated builder functions, following TFLite's ``schema.fbs``:

- the ``TFL3`` identifier, schema version 3, buffer 0 the empty sentinel; each constant's
  little-endian bytes in a buffer aligned to 16 bytes (identical constants share one), INT4
  packed two values a byte, low nibble first; activations point to buffer 0;
- one operator code per (builtin, custom code, version), with ``builtin_code`` and
  ``deprecated_builtin_code`` (the latter capped at 127, as TFLite does since its codes passed
  127);
- an op's version, when not given, is the least LiteRT needs for the op and its tensors
  (:func:`tflite_op_version`, after TensorFlow's ``op_version.cc``);
- builtin options from the op's ``options`` dict into its options table;
- SignatureDefs: the model's, or ``serving_default`` over subgraph 0's inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ferry.errors import InvalidInputError
from ferry.tflite._schema import (
    OPTION_ENUMS,
    TFLITE_DTYPES,
    TFLITE_INT4,
    TFLITE_TYPE_NAMES,
    OptionField,
    TFLiteModel,
    TFLiteOperator,
    TFLiteSchema,
    TFLiteSignature,
    TFLiteSparsity,
    TFLiteSubgraph,
    TFLiteTensor,
    option_specs,
    tflite_schema,
)
from ferry.tflite._versions import enum_values, tflite_op_version
from ferry.tflite._writer_build import BUFFER_ALIGNMENT, FlatbufferBuilder, OpPlan, Plan

__all__ = ["write_tflite"]

#: Flatbuffers address everything with signed 32-bit offsets: a file stops at 2 GiB.
FLATBUFFER_LIMIT = 2**31 - 1

#: Builtin operators whose LiteRT parser refuses an absent options table (the others take the
#: schema defaults); the writer gives them their table even when ``options`` is empty.
_NEEDS_OPTIONS = frozenset({"LSTM"})


def write_tflite(model: TFLiteModel) -> bytes:
    """Serialize ``model`` into a ``.tflite`` flatbuffer.

    Operators with ``version`` 0 (or None) get the least version LiteRT needs for them
    (:func:`tflite_op_version`); an explicit version is kept. An operator with no
    ``options_type`` takes its opcode's options table, written when it has options (or when
    LiteRT needs the table). A model without signatures gets ``serving_default`` over subgraph
    0's inputs and outputs, named by their tensor names.

    Args:
        model: the model as plain data; not modified.

    Returns:
        The file's bytes.

    Raises:
        InvalidInputError: the model is not valid TFLite (an index out of range, a constant that
            does not match its dtype or shape, an unknown option, sparse or quantization data
            that does not fit), naming the subgraph, op and tensor; or it exceeds the
            flatbuffer's 2 GiB limit.
        BackendUnavailableError: the ``tflite`` schema package is not installed.
    """
    schema = tflite_schema()
    plan = _Checker(schema, model).check()
    return FlatbufferBuilder(schema, model, plan).build()


# ------------------------------------------------------------------------------- validation


class _Checker:
    def __init__(self, schema: TFLiteSchema, model: TFLiteModel) -> None:
        self.schema = schema
        self.model = model
        self.buffers: list[np.ndarray | None] = [None]  # buffer 0: the empty sentinel
        self._shared: dict[tuple[int, bytes], list[int]] = {}
        self.size = 1024  # the model table, vtables and alignment slack

    def check(self) -> Plan:
        model = self.model
        if model.version != 3:
            raise InvalidInputError(
                f"the TFLite model has schema version {model.version}; LiteRT reads only "
                "version 3: set TFLiteModel.version to 3"
            )
        if not model.subgraphs:
            raise InvalidInputError("the TFLite model has no subgraph: it needs at least one")
        ops, tensor_buffers = [], []
        for position, sg in enumerate(model.subgraphs):
            tensor_buffers.append([self._tensor(position, i, t) for i, t in enumerate(sg.tensors)])
            self._graph(sg, position)
            ops.append([self._operator(sg, position, op) for op in sg.operators])
        metadata = {}
        for name, data in model.metadata.items():
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise InvalidInputError(
                    f"metadata '{name}' is a {type(data).__name__}; metadata values are bytes"
                )
            metadata[name] = self._buffer(np.frombuffer(bytes(data), np.uint8), share=False)
        signatures = self._signatures()
        if self.size > FLATBUFFER_LIMIT:
            raise InvalidInputError(
                f"the TFLite model needs about {self.size / 2**30:.2f} GiB, over the 2 GiB a "
                "flatbuffer can address; ferry does not write TFLite's large-model layout "
                "(weights after the flatbuffer): shrink the model (quantize its weights)"
            )
        return Plan(ops, tensor_buffers, self.buffers, metadata, signatures, self.size)

    # ---- tensors

    def _tensor(self, position: int, index: int, t: TFLiteTensor) -> int:
        where = f"subgraph {position}, tensor {t.index} '{t.name}'"
        if index != t.index:
            raise InvalidInputError(
                f"{where} sits at position {index} of the subgraph's tensors; operators "
                "name tensors by position, so its index must be its position"
            )
        if t.type not in TFLITE_TYPE_NAMES:
            raise InvalidInputError(f"{where} has unknown TensorType code {t.type}")
        if any(not isinstance(d, (int, np.integer)) or d < 0 for d in t.shape):
            raise InvalidInputError(
                f"{where} has shape {list(t.shape)}; dims are non-negative integers (an open "
                "dim is a placeholder here and -1 in the signature)"
            )
        if t.signature is not None and (
            len(t.signature) != len(t.shape) or any(d < -1 for d in t.signature)
        ):
            raise InvalidInputError(
                f"{where} has shape signature {list(t.signature)} for shape {list(t.shape)}; "
                "it needs one entry a dim, -1 for an open one"
            )
        self._quant(t, where)
        self.size += 96 + len(t.name.encode("utf-8")) + 8 * len(t.shape)
        if t.data is not None and t.raw is not None:
            raise InvalidInputError(f"{where} has both data and raw bytes; give one")
        if t.raw is not None:
            return self._buffer(np.frombuffer(bytes(t.raw), np.uint8), share=not t.is_variable)
        if t.data is None:
            if t.opaque:
                raise InvalidInputError(
                    f"{where} is a {t.type_name} constant whose bytes were not kept (opaque, "
                    "raw is None); set raw to its buffer bytes"
                )
            return 0
        if t.sparsity is not None:
            self._sparsity(t, t.sparsity, where)
        return self._buffer(self._data(t, where), share=not t.is_variable)

    def _data(self, t: TFLiteTensor, where: str) -> np.ndarray:
        """The constant's bytes as TFLite stores them (little-endian, INT4 packed)."""
        want = TFLITE_DTYPES.get(t.type)
        if want is None:
            raise InvalidInputError(
                f"{where} is a {t.type_name} tensor: ferry cannot encode numpy data for it; "
                "give its buffer bytes as raw"
            )
        data = t.data
        if not isinstance(data, np.ndarray):
            raise InvalidInputError(
                f"{where} has data of type {type(data).__name__}; give a numpy array"
            )
        if data.dtype.kind != want.kind or data.dtype.itemsize != want.itemsize:
            raise InvalidInputError(
                f"{where} is {t.type_name} but its data is {data.dtype}; give "
                f"{want.name} values"
                + (" (INT4 as int8 values in [-8, 7], one a byte)" if t.type == TFLITE_INT4 else "")
            )
        if t.sparsity is None and data.shape != tuple(t.shape):
            raise InvalidInputError(
                f"{where} has shape {list(t.shape)} but its data has shape {list(data.shape)}"
            )
        if t.type == TFLITE_INT4:
            flat = data.reshape(-1)
            if flat.size and (int(flat.min()) < -8 or int(flat.max()) > 7):
                raise InvalidInputError(
                    f"{where} is int4 but holds values outside [-8, 7] "
                    f"({int(flat.min())}..{int(flat.max())})"
                )
            nibbles = (flat.astype(np.int16) & 0x0F).astype(np.uint8)
            if nibbles.size % 2:
                nibbles = np.append(nibbles, np.uint8(0))
            return nibbles[0::2] | (nibbles[1::2] << 4)
        little = data.astype(want.newbyteorder("<"), copy=False)
        return np.ascontiguousarray(little).reshape(-1).view(np.uint8)

    def _buffer(self, data: np.ndarray, *, share: bool) -> int:
        if not data.size:
            return 0
        if share:
            # Candidates by length and a sample of bytes, then compared whole: hashing every
            # weight would cost more than the rest of writing, and equal constants are rare.
            step = max(1, data.size // 64)
            key = (data.size, data[::step][:64].tobytes() + data[-16:].tobytes())
            candidates = self._shared.setdefault(key, [])
            for index in candidates:
                other = self.buffers[index]
                if other is not None and np.array_equal(other, data):
                    return index
            candidates.append(len(self.buffers))
        self.size += data.size + BUFFER_ALIGNMENT + 16
        self.buffers.append(data)
        return len(self.buffers) - 1

    def _quant(self, t: TFLiteTensor, where: str) -> None:
        q = t.quant
        if q is None:
            return
        scale = np.asarray(q.scale).reshape(-1)
        zero = np.asarray(q.zero_point).reshape(-1)
        if not scale.size:
            raise InvalidInputError(f"{where} has quantization without scales")
        if zero.size != scale.size:
            raise InvalidInputError(
                f"{where} has {scale.size} quantization scales but {zero.size} zero points"
            )
        fits = 0 <= q.axis < len(t.shape) and t.shape[q.axis] == scale.size
        if scale.size > 1 and not fits:
            raise InvalidInputError(
                f"{where} of shape {list(t.shape)} has {scale.size} scales along axis "
                f"{q.axis}; per-channel quantization needs one scale per element of that axis"
            )
        self.size += 16 * scale.size + 64

    def _sparsity(self, t: TFLiteTensor, sp: TFLiteSparsity, where: str) -> None:
        rank = len(t.shape)
        levels = len(sp.traversal_order) or rank
        if len(sp.dims) != levels or levels != rank + len(sp.block_map):
            raise InvalidInputError(
                f"{where} is sparse with traversal order {list(sp.traversal_order)}, block map "
                f"{list(sp.block_map)} and {len(sp.dims)} dim descriptions for rank {rank}; "
                "they do not fit together"
            )
        for d in sp.dims:
            if not d.dense and (d.segments is None or d.indices is None):
                raise InvalidInputError(
                    f"{where} is sparse with a compressed dim lacking its segments or indices"
                )
            if not d.dense:
                assert d.segments is not None and d.indices is not None
                self.size += 4 * (d.segments.size + d.indices.size) + 64

    # ---- operators

    def _graph(self, sg: TFLiteSubgraph, position: int) -> None:
        """Indices in range, and every tensor an op reads exists by then."""
        count = len(sg.tensors)
        for role, indices in (("input", sg.inputs), ("output", sg.outputs)):
            for t in indices:
                if not 0 <= t < count:
                    raise InvalidInputError(
                        f"subgraph {position} lists {role} tensor {t}, out of range (it has "
                        f"{count} tensors)"
                    )
        ready = set(sg.inputs)
        for tensor in sg.tensors:
            constant = tensor.data is not None or tensor.raw is not None
            # An empty constant (a buffer of no bytes) reads back as no data: it counts too.
            if constant or tensor.is_variable or 0 in tensor.shape:
                ready.add(tensor.index)
        written: dict[int, int] = {}
        for i, op in enumerate(sg.operators):
            where = f"subgraph {position}, operator {i} ({op.display_name})"
            for role, indices, lowest in (
                ("input", op.inputs, -1),
                ("output", op.outputs, 0),
                ("intermediate", op.intermediates, 0),
            ):
                for t in indices:
                    if not lowest <= t < count:
                        raise InvalidInputError(
                            f"{where} names {role} tensor {t}, out of range (the subgraph has "
                            f"{count} tensors"
                            + ("; -1 marks an omitted optional input)" if role == "input" else ")")
                        )
            for t in op.inputs:
                if t >= 0 and t not in ready:
                    raise InvalidInputError(
                        f"{where} reads tensor {t} '{sg.tensors[t].name}', which is no subgraph "
                        "input, constant or variable, and no earlier operator writes"
                    )
            for t in op.outputs:
                tensor = sg.tensors[t]
                if tensor.data is not None or tensor.raw is not None:
                    raise InvalidInputError(
                        f"{where} writes tensor {t} '{tensor.name}', a constant"
                    )
                if t in written:
                    raise InvalidInputError(
                        f"{where} writes tensor {t} '{tensor.name}', which operator "
                        f"{written[t]} writes too"
                    )
                written[t] = i
                ready.add(t)
            ready.update(op.intermediates)

    def _operator(self, sg: TFLiteSubgraph, position: int, op: TFLiteOperator) -> OpPlan:
        where = f"subgraph {position}, operator {op.index} ({op.display_name})"
        code = self._code(op, where)
        custom = None
        if op.opcode == "CUSTOM":
            if not op.custom_code:
                raise InvalidInputError(f"{where} is CUSTOM without a custom_code")
            custom = op.custom_code
            if op.options:
                raise InvalidInputError(
                    f"{where} is a custom op with builtin options {sorted(op.options)}; a custom "
                    "op's options go in custom_options (bytes)"
                )
        elif op.custom_options is not None and op.custom_options:
            raise InvalidInputError(
                f"{where} is a builtin op with custom_options; only CUSTOM ops take them"
            )
        table, union, union_code, values = self._options(op, where)
        version = int(op.version or 0)
        if version < 0:
            raise InvalidInputError(f"{where} has version {version}; versions start at 1")
        if not version:
            version = tflite_op_version(op, sg.tensors)
        n = len(op.inputs) + len(op.outputs) + len(op.intermediates)
        self.size += 128 + 4 * n + 32 * len(values) + len(op.custom_options or b"")
        for _, value in values:
            if isinstance(value, np.ndarray):
                self.size += value.nbytes
        return OpPlan(code, custom, version, table, union, union_code, values)

    def _code(self, op: TFLiteOperator, where: str) -> int:
        codes = self.schema.builtin_codes
        if op.opcode in codes:
            return int(codes[op.opcode])
        if op.opcode.startswith("BUILTIN_") and op.opcode[8:].isdigit():
            return int(op.opcode[8:])  # what the reader names a code newer than the schema
        raise InvalidInputError(
            f"{where}: '{op.opcode}' is no TFLite builtin operator; use a BuiltinOperator name "
            "(CONV_2D, FULLY_CONNECTED...) or CUSTOM with a custom_code"
        )

    def _options(
        self, op: TFLiteOperator, where: str
    ) -> tuple[str | None, int, int, list[tuple[OptionField, Any]]]:
        table = op.options_type
        explicit = table is not None
        own = self.schema.options_types.get(op.opcode)
        if explicit and own is not None and table != own:
            # LiteRT would look for its own table, find another, and run on the defaults.
            raise InvalidInputError(
                f"{where} has options_type '{table}', but {op.opcode} takes {own}"
            )
        if table is None and op.opcode != "CUSTOM":
            table = own
        if table is None:
            if op.options:
                raise InvalidInputError(
                    f"{where} takes no builtin options, but was given {sorted(op.options)}"
                )
            return None, 0, 0, []
        if table in self.schema.options_codes:
            union, union_code = 1, self.schema.options_codes[table]
            cls = self.schema.options_classes.get(union_code)
        elif table in self.schema.options2_codes:
            union, union_code = 2, self.schema.options2_codes[table]
            cls = self.schema.options2_classes.get(union_code)
        else:
            raise InvalidInputError(
                f"{where} has options_type '{table}', which is no TFLite builtin options table"
            )
        if cls is None:
            raise InvalidInputError(f"{where}: the tflite package lacks the '{table}' table")
        if not (explicit or op.options or op.opcode in _NEEDS_OPTIONS):
            return None, 0, 0, []  # all defaults: LiteRT reads an absent table as them
        specs = {f.name: f for f in option_specs(cls)}
        unknown = sorted(set(op.options) - set(specs))
        if unknown:
            raise InvalidInputError(
                f"{where} has unknown option(s) {unknown} for {table}; the known ones are "
                f"{sorted(specs) or 'none'}"
            )
        values = []
        for name, value in op.options.items():
            field = specs[name]
            converted = _option_value(self.schema, field, value, f"{where}, option '{name}'")
            if converted is not None:
                values.append((field, converted))
        return table, union, union_code, values

    # ---- signatures

    def _signatures(self) -> list[TFLiteSignature]:
        model = self.model
        signatures = list(model.signatures)
        if not signatures:
            main = model.subgraphs[0]
            signatures = [
                TFLiteSignature(
                    key="serving_default",
                    subgraph=0,
                    inputs=_named(main, main.inputs),
                    outputs=_named(main, main.outputs),
                )
            ]
        keys = set()
        for sig in signatures:
            where = f"signature '{sig.key}'"
            if not sig.key:
                raise InvalidInputError("a signature has an empty key; name it")
            if sig.key in keys:
                raise InvalidInputError(f"{where} is defined twice")
            keys.add(sig.key)
            if not 0 <= sig.subgraph < len(model.subgraphs):
                raise InvalidInputError(
                    f"{where} runs subgraph {sig.subgraph}, out of range (the model has "
                    f"{len(model.subgraphs)})"
                )
            graph = model.subgraphs[sig.subgraph]
            count = len(graph.tensors)
            for role, names, ends in (
                ("input", sig.inputs, graph.inputs),
                ("output", sig.outputs, graph.outputs),
            ):
                for name, t in names.items():
                    if not 0 <= t < count:
                        raise InvalidInputError(
                            f"{where} maps {role} '{name}' to tensor {t}, out of range "
                            f"(subgraph {sig.subgraph} has {count} tensors)"
                        )
                    if t not in ends:
                        # LiteRT's signature runner reads and writes only the subgraph's own
                        # ends; an inner tensor's memory is reused by later ops.
                        raise InvalidInputError(
                            f"{where} maps {role} '{name}' to tensor {t} "
                            f"'{graph.tensors[t].name}', which is no {role} of subgraph "
                            f"{sig.subgraph}; add it to the subgraph's {role}s"
                        )
                self.size += sum(32 + len(n.encode("utf-8")) for n in names)
        return signatures


def _named(sg: TFLiteSubgraph, indices: Sequence[int]) -> dict[str, int]:
    """Tensor name -> index, names made unique (``x``, ``x_1``...)."""
    named: dict[str, int] = {}
    for t in indices:
        base = sg.tensors[t].name if 0 <= t < len(sg.tensors) else f"tensor_{t}"
        name, n = base, 0
        while name in named:
            n += 1
            name = f"{base}_{n}"
        named[name] = t
    return named


def _option_value(schema: TFLiteSchema, field: OptionField, value: Any, where: str) -> Any:
    """``value`` as the builder function for ``field`` takes it; None: leave the field out."""
    if field.kind == "scalar":
        assert field.dtype is not None
        if isinstance(value, str) and field.name in OPTION_ENUMS:
            names = enum_values(schema, field.name)
            if value.upper() not in names:
                raise InvalidInputError(
                    f"{where} is '{value}'; the {OPTION_ENUMS[field.name]} values are "
                    f"{sorted(names)}"
                )
            value = names[value.upper()]
        if field.dtype.kind == "b":
            if isinstance(value, (bool, np.bool_)) or value in (0, 1):
                return bool(value)
            raise InvalidInputError(f"{where} is {value!r}; it is a boolean")
        if field.dtype.kind == "f":
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
                value, bool
            ):
                return float(value)
            raise InvalidInputError(f"{where} is {value!r}; it is a number")
        if isinstance(value, (bool, np.bool_, int, np.integer)):
            info = np.iinfo(field.dtype)
            if not info.min <= int(value) <= info.max:
                raise InvalidInputError(
                    f"{where} is {int(value)}, outside the field's {field.dtype} range"
                )
            return int(value)
        raise InvalidInputError(
            f"{where} is {value!r}; it is an integer"
            + (f" or a {OPTION_ENUMS[field.name]} name" if field.name in OPTION_ENUMS else "")
        )
    if field.kind == "vector":
        assert field.dtype is not None
        # The reader gives 0 for an absent vector (the generated accessor's habit).
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
            return None
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"{where} is {value!r}; it is a list of numbers") from e
        if array.ndim != 1 or (array.size and array.dtype.kind not in "biuf"):
            raise InvalidInputError(f"{where} is {value!r}; it is a flat list of numbers")
        cast = array.astype(field.dtype.newbyteorder("<"))
        if array.size and field.dtype.kind in "iu" and not np.array_equal(cast, array):
            raise InvalidInputError(f"{where} is {value!r}; its values do not fit {field.dtype}")
        return cast
    if field.kind == "string":
        if value is None:
            return None
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isinstance(value, str):
            return value
        raise InvalidInputError(f"{where} is {value!r}; it is a string")
    raise InvalidInputError(f"{where}: ferry cannot write this kind of option field")
