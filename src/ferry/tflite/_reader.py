"""Read a ``.tflite`` flatbuffer into plain data (the dataclasses of ``_schema``).

The flatbuffer is walked once, eagerly, through the classes of the ``tflite`` package (generated
from TFLite's ``schema.fbs``, pure Python). Reading eagerly means a corrupt or truncated file fails
here, with the file named, rather than halfway through a translation; the constant buffers are
kept as zero-copy numpy views of the file's bytes. Sparse constants keep their compressed values;
:func:`densify_tflite` expands them. What is read is enough to write the model back
(:func:`ferry.tflite.write_tflite`): options tables by name, SignatureDefs, metadata.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from ferry.errors import ModelLoadError
from ferry.tflite._schema import (
    TFLITE_DTYPES,
    TFLITE_INT4,
    TFLiteDimMetadata,
    TFLiteModel,
    TFLiteOperator,
    TFLiteQuant,
    TFLiteSchema,
    TFLiteSignature,
    TFLiteSparsity,
    TFLiteSubgraph,
    TFLiteTensor,
    is_tflite,
    option_fields,
    tflite_schema,
)

__all__ = ["densify_tflite", "read_tflite"]


def read_tflite(data: bytes, source: str) -> TFLiteModel:
    """Parse a TFLite flatbuffer.

    Args:
        data: the file's bytes.
        source: the file's name (or a description of the in-memory bytes), for messages.

    Raises:
        ModelLoadError: ``data`` is not a TFLite flatbuffer, or is corrupt or truncated.
        BackendUnavailableError: the ``tflite`` schema package is not installed.
    """
    if not is_tflite(data):
        raise ModelLoadError(
            f"{source} is not a TFLite model: it lacks the 'TFL3' flatbuffer identifier "
            "at bytes 4..8"
        )
    schema = tflite_schema()
    try:
        return _Reader(schema, data, source).model()
    except ModelLoadError as e:
        if source in str(e):
            raise
        # Checks deep in the walk (a buffer index, a quantization) do not know the file's name.
        raise ModelLoadError(f"{source}: {e}; the file is corrupt, re-export the model") from e
    except (IndexError, ValueError, TypeError, struct.error, UnicodeDecodeError) as e:
        # The generated accessors trust every offset in the file; a corrupt one surfaces as one
        # of these while unpacking.
        raise ModelLoadError(
            f"{source} is a corrupt or truncated TFLite flatbuffer ({type(e).__name__}: {e}); "
            "re-export the model"
        ) from e


class _Reader:
    def __init__(self, schema: TFLiteSchema, data: bytes, source: str = "the model") -> None:
        self.source = source
        self.schema = schema.module
        self.data = data
        self.root = self.schema.Model.GetRootAs(data, 0)
        self.builtin_names = schema.builtin_names
        self.options_classes = schema.options_classes
        self.options2_classes = schema.options2_classes
        self._buffers: dict[int, np.ndarray | None] = {}

    def model(self) -> TFLiteModel:
        root = self.root
        codes = [self._opcode(root.OperatorCodes(i)) for i in range(root.OperatorCodesLength())]
        subgraphs = [self._subgraph(i, codes) for i in range(root.SubgraphsLength())]
        if not subgraphs:
            raise ModelLoadError("the TFLite model has no subgraph")
        description = root.Description()
        return TFLiteModel(
            version=int(root.Version()),
            description=description.decode("utf-8", "replace") if description else "",
            subgraphs=subgraphs,
            signatures=[self._signature(i, subgraphs) for i in range(root.SignatureDefsLength())],
            metadata=self._metadata(),
        )

    def _signature(self, index: int, subgraphs: list[TFLiteSubgraph]) -> TFLiteSignature:
        sig = self.root.SignatureDefs(index)
        key = _text(sig.SignatureKey())
        graph = int(sig.SubgraphIndex())
        if not 0 <= graph < len(subgraphs):
            raise ModelLoadError(
                f"{self.source}: signature '{key}' names subgraph {graph} out of range; the "
                "file is corrupt, re-export the model"
            )
        count = len(subgraphs[graph].tensors)

        def names(get: Any, length: int) -> dict[str, int]:
            found = {}
            for i in range(length):
                entry = get(i)
                tensor = int(entry.TensorIndex())
                if not 0 <= tensor < count:
                    raise ModelLoadError(
                        f"{self.source}: signature '{key}' names tensor {tensor} out of range; "
                        "the file is corrupt, re-export the model"
                    )
                found[_text(entry.Name())] = tensor
            return found

        return TFLiteSignature(
            key=key,
            subgraph=graph,
            inputs=names(sig.Inputs, sig.InputsLength()),
            outputs=names(sig.Outputs, sig.OutputsLength()),
        )

    def _metadata(self) -> dict[str, bytes]:
        found = {}
        for i in range(self.root.MetadataLength()):
            entry = self.root.Metadata(i)
            index = int(entry.Buffer())
            if not 0 <= index < self.root.BuffersLength():
                raise ModelLoadError(
                    f"{self.source}: metadata '{_text(entry.Name())}' names buffer {index} out "
                    "of range; the file is corrupt, re-export the model"
                )
            data = self._buffer(index)
            found[_text(entry.Name())] = b"" if data is None else data.tobytes()
        return found

    def _opcode(self, code: Any) -> tuple[str, str | None, int]:
        # Codes above 127 live in builtin_code; older files only fill deprecated_builtin_code.
        number = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
        name = self.builtin_names.get(number, f"BUILTIN_{number}")
        custom = code.CustomCode()
        return name, custom.decode("utf-8", "replace") if custom else None, int(code.Version())

    def _subgraph(self, index: int, codes: list[tuple[str, str | None, int]]) -> TFLiteSubgraph:
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
            intermediates = _ints(op.IntermediatesAsNumpy())
            for t in (*inputs, *outputs, *intermediates):
                if not -1 <= t < count:
                    raise ModelLoadError(
                        f"{self.source}: operator {i} ({name}) names tensor {t} out of range"
                    )
            custom_options = None
            if op.CustomOptionsLength():
                custom_options = op.CustomOptionsAsNumpy().tobytes()
            elif op.LargeCustomOptionsSize():
                start = int(op.LargeCustomOptionsOffset())
                custom_options = self.data[start : start + int(op.LargeCustomOptionsSize())]
            options, options_type = self._options(op)
            operators.append(
                TFLiteOperator(
                    index=i,
                    opcode=name,
                    custom_code=custom,
                    version=version,
                    inputs=inputs,
                    outputs=outputs,
                    options=options,
                    custom_options=custom_options,
                    options_type=options_type,
                    intermediates=intermediates,
                )
            )
        inputs = _ints(sg.InputsAsNumpy())
        outputs = _ints(sg.OutputsAsNumpy())
        for t in (*inputs, *outputs):
            if not 0 <= t < count:
                raise ModelLoadError(f"subgraph {index} names tensor {t} out of range")
        name = sg.Name()
        return TFLiteSubgraph(
            index=index,
            name=name.decode("utf-8", "replace") if name else "",
            tensors=tensors,
            inputs=inputs,
            outputs=outputs,
            operators=operators,
        )

    def _tensor(self, t: Any, index: int) -> TFLiteTensor:
        name = t.Name()
        shape = _ints(t.ShapeAsNumpy())
        signature = _ints(t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else None
        ttype = int(t.Type())
        sparsity = self._sparsity(t.Sparsity())
        raw = self._buffer(int(t.Buffer()))
        data = None
        opaque = False
        kept = None
        if raw is not None and raw.size:
            if ttype in TFLITE_DTYPES:
                data = _decode(raw, ttype, shape, sparse=sparsity is not None, index=index)
            else:  # strings, resources...: only an op that reads it can say whether it matters
                opaque = True
                kept = raw.tobytes()
        return TFLiteTensor(
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
            raw=kept,
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

    def _quant(self, q: Any) -> TFLiteQuant | None:
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
        return TFLiteQuant(scale=scale, zero_point=zero, axis=int(q.QuantizedDimension()))

    def _sparsity(self, s: Any) -> TFLiteSparsity | None:
        if s is None:
            return None
        dims = []
        for i in range(s.DimMetadataLength()):
            d = s.DimMetadata(i)
            dense = int(d.Format()) == 0
            dims.append(
                TFLiteDimMetadata(
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
        return TFLiteSparsity(
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

    def _options(self, op: Any) -> tuple[dict[str, Any], str | None]:
        """The op's builtin options and the name of their table (None when it has none).

        StableHLO ops keep theirs in ``builtin_options_2``, a second union.
        """
        kind = int(op.BuiltinOptionsType())
        if kind:
            cls, table = self.options_classes.get(kind), op.BuiltinOptions()
        else:
            kind = int(op.BuiltinOptions2Type())
            if not kind:
                return {}, None
            cls, table = self.options2_classes.get(kind), op.BuiltinOptions2()
        if cls is None or table is None:
            return {}, None
        obj = cls()
        obj.Init(table.Bytes, table.Pos)
        return {name: _plain(getter(obj)) for name, getter in option_fields(cls)}, cls.__name__


def _decode(
    raw: np.ndarray, ttype: int, shape: tuple[int, ...], *, sparse: bool, index: int
) -> np.ndarray:
    """The constant's values from its buffer bytes, shaped (sparse ones stay flat)."""
    dtype = TFLITE_DTYPES[ttype]
    count = int(np.prod(shape)) if shape else 1
    if ttype == TFLITE_INT4:
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


def _text(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


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


# ---------------------------------------------------------------------------- sparse constants


#: The most elements a sparse weight may densify to (2**31: 8 GiB of float32).
_MAX_DENSE_ELEMENTS = 1 << 31


def densify_tflite(
    values: np.ndarray, sparsity: TFLiteSparsity, shape: Sequence[int]
) -> np.ndarray:
    """The dense array of ``shape`` that sparse ``values`` described by ``sparsity`` stand for.

    TFLite stores a sparse tensor in a TACO-style format (``SparsityParameters`` in schema.fbs):
    the dims are visited in ``traversal_order``; dims listed in ``block_map`` are also split into
    blocks, whose inner dims come after the original ones; each visited dim is either DENSE (every
    index) or SPARSE_CSR (``segments``/``indices`` list the present indices). The stored values
    are the present elements in visiting order. This follows TFLite's own
    ``FormatConverter::SparseToDense``.

    Raises:
        ModelLoadError: the sparsity description does not fit the shape or the values.
    """
    rank = len(shape)
    order = list(sparsity.traversal_order) or list(range(rank))
    block_map = list(sparsity.block_map)
    levels = sparsity.dims
    if len(order) != rank + len(block_map) or len(levels) != len(order):
        raise ModelLoadError(
            f"sparse tensor of shape {list(shape)}: traversal order {order}, block map "
            f"{block_map} and {len(levels)} dim descriptions do not fit together"
        )
    block_sizes = [levels[order.index(rank + k)].dense_size for k in range(len(block_map))]
    elements = math.prod(int(d) for d in shape)
    if any(int(d) < 0 for d in shape) or elements > _MAX_DENSE_ELEMENTS:
        raise ModelLoadError(
            f"sparse tensor of shape {list(shape)}: its dense form would hold {elements} "
            f"elements, more than the {_MAX_DENSE_ELEMENTS} a weight can; the file is corrupt"
        )
    # Walk the levels breadth-first over all paths at once; expanding each path in place keeps
    # the depth-first order in which the values are stored.
    previous = np.zeros(1, dtype=np.int64)  # per path: its position in the level above
    columns: list[np.ndarray] = []  # per level: the index each path takes there
    for meta in levels:
        if meta.dense:
            size = meta.dense_size
            # Paths only multiply: past the stored values they cannot fit (and a corrupt size
            # would otherwise allocate without bound before the final count check).
            if size < 0 or previous.size * size > values.size:
                raise ModelLoadError(
                    f"a sparse tensor's dense dim of {size} lists more elements than the "
                    f"{values.size} values it stores"
                )
            columns = [np.repeat(c, size) for c in columns]
            columns.append(np.tile(np.arange(size, dtype=np.int64), previous.size))
            previous = (previous[:, None] * size + np.arange(size)).reshape(-1)
            continue
        assert meta.segments is not None and meta.indices is not None
        if previous.size and int(previous.max()) + 1 >= meta.segments.size:
            raise ModelLoadError("a sparse tensor's segment array is too short")
        starts = meta.segments[previous]
        counts = meta.segments[previous + 1] - starts
        if np.any(counts < 0):
            raise ModelLoadError("a sparse tensor's segments are not ascending")
        total = int(counts.sum())
        if total > values.size:
            raise ModelLoadError(
                f"a sparse tensor lists {total} elements but stores {values.size} values"
            )
        first = np.cumsum(counts) - counts
        children = np.repeat(starts - first, counts) + np.arange(total, dtype=np.int64)
        if total and int(children.max()) >= meta.indices.size:
            raise ModelLoadError("a sparse tensor's index array is too short")
        columns = [np.repeat(c, counts) for c in columns]
        columns.append(meta.indices[children])
        previous = children
    count = previous.size
    if count > values.size:
        raise ModelLoadError(
            f"a sparse tensor lists {count} elements but stores {values.size} values"
        )
    original = [np.zeros(count, dtype=np.int64) for _ in range(rank)]
    for level in range(rank):
        original[order[level]] = columns[level]
    for level in range(rank, len(order)):
        block = order[level] - rank
        dim = block_map[block]
        original[dim] = original[dim] * block_sizes[block] + columns[level]
    flat = np.ravel_multi_index(tuple(original), tuple(shape)) if rank else np.zeros(1, np.int64)
    dense = np.zeros(int(np.prod(shape)) if shape else 1, dtype=values.dtype)
    dense[flat] = values[:count]
    return dense.reshape(tuple(shape))
