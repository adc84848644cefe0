"""The building half of the TFLite writer: a checked model (:class:`Plan`) as flatbuffer bytes.

:func:`ferry.tflite.write_tflite` checks the model whole first (``_writer``), which gives a
:class:`Plan`; :class:`FlatbufferBuilder` then writes it with the ``tflite`` package's generated
builder functions, following TFLite's ``schema.fbs``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ferry.errors import InvalidInputError
from ferry.tflite._schema import (
    TFLITE_IDENTIFIER,
    OptionField,
    TFLiteModel,
    TFLiteOperator,
    TFLiteSchema,
    TFLiteSignature,
    TFLiteSparsity,
    TFLiteSubgraph,
    TFLiteTensor,
)

__all__ = ["BUFFER_ALIGNMENT", "FlatbufferBuilder", "OpPlan", "Plan"]

#: Constant buffers are aligned like TensorFlow's converter aligns them, so that kernels may
#: read them in place (mmap) with vector loads.
BUFFER_ALIGNMENT = 16

#: The last builtin code that fits ``deprecated_builtin_code`` (a byte); larger codes put
#: PLACEHOLDER_FOR_GREATER_OP_CODES (127) there.
DEPRECATED_CODE_MAX = 127


@dataclasses.dataclass
class OpPlan:
    """An operator, checked: what the builder writes for it."""

    code: int
    custom_code: str | None
    version: int
    table: str | None  # options table name, or None for no table
    union: int  # 1: builtin_options, 2: builtin_options_2
    union_code: int
    values: list[tuple[OptionField, Any]]


@dataclasses.dataclass
class Plan:
    """The checked model: per-op plans, per-tensor buffer indices, the buffers, signatures."""

    ops: list[list[OpPlan]]
    tensor_buffers: list[list[int]]
    buffers: list[np.ndarray | None]
    metadata_buffers: dict[str, int]
    signatures: list[TFLiteSignature]
    size: int


class FlatbufferBuilder:
    """Writes a checked model; :meth:`build` gives the file's bytes."""

    def __init__(self, schema: TFLiteSchema, model: TFLiteModel, plan: Plan) -> None:
        import flatbuffers

        self.fb = schema.module
        self.model = model
        self.plan = plan
        # Sized for the whole model: growing doubles and copies the buffer each time.
        self.b = flatbuffers.Builder(min(plan.size + plan.size // 8 + 4096, 2**31))
        self._sizes = flatbuffers.builder.BuilderSizeError

    def build(self) -> bytes:
        try:
            return self._build()
        except self._sizes as e:
            raise InvalidInputError(
                "the TFLite model exceeds the 2 GiB a flatbuffer can address; ferry does not "
                "write TFLite's large-model layout: shrink the model (quantize its weights)"
            ) from e

    def _build(self) -> bytes:
        fb, b, model, plan = self.fb, self.b, self.model, self.plan
        buffers = [self._buffer(data) for data in plan.buffers]
        codes: dict[tuple[int, str | None, int], int] = {}
        for graph in plan.ops:
            for op in graph:
                codes.setdefault((op.code, op.custom_code, op.version), len(codes))
        subgraphs = [
            self._subgraph(sg, plan.ops[i], plan.tensor_buffers[i], codes)
            for i, sg in enumerate(model.subgraphs)
        ]
        opcodes = [self._opcode(*key) for key in codes]
        signatures = [self._signature(s) for s in plan.signatures]
        metadata = []
        for name, buffer in plan.metadata_buffers.items():
            text = b.CreateString(name)
            fb.MetadataStart(b)
            fb.MetadataAddName(b, text)
            fb.MetadataAddBuffer(b, buffer)
            metadata.append(fb.MetadataEnd(b))
        description = b.CreateString(model.description)

        opcodes_vec = self._tables(fb.ModelStartOperatorCodesVector, opcodes)
        subgraphs_vec = self._tables(fb.ModelStartSubgraphsVector, subgraphs)
        buffers_vec = self._tables(fb.ModelStartBuffersVector, buffers)
        signatures_vec = self._tables(fb.ModelStartSignatureDefsVector, signatures)
        metadata_vec = self._tables(fb.ModelStartMetadataVector, metadata) if metadata else None
        fb.ModelStart(b)
        fb.ModelAddVersion(b, model.version)
        fb.ModelAddOperatorCodes(b, opcodes_vec)
        fb.ModelAddSubgraphs(b, subgraphs_vec)
        fb.ModelAddDescription(b, description)
        fb.ModelAddBuffers(b, buffers_vec)
        if metadata_vec is not None:
            fb.ModelAddMetadata(b, metadata_vec)
        fb.ModelAddSignatureDefs(b, signatures_vec)
        root = fb.ModelEnd(b)
        b.Finish(root, file_identifier=TFLITE_IDENTIFIER)
        return bytes(memoryview(b.Bytes)[b.Head() :])

    # ---- pieces

    def _tables(self, start: Callable[[Any, int], Any], offsets: Sequence[int]) -> int:
        b = self.b
        start(b, len(offsets))
        for off in reversed(offsets):
            b.PrependUOffsetTRelative(off)
        return int(b.EndVector())

    def _ints(self, values: Sequence[int] | np.ndarray, dtype: str = "<i4") -> int:
        return int(self.b.CreateNumpyVector(np.asarray(values, dtype=dtype).reshape(-1)))

    def _buffer(self, data: np.ndarray | None) -> int:
        fb, b = self.fb, self.b
        vector = None
        if data is not None:
            # CreateNumpyVector aligns to the element (1 byte); kernels want 16.
            b.StartVector(1, data.size, BUFFER_ALIGNMENT)
            b.head = b.head - data.size
            b.Bytes[b.head : b.head + data.size] = data.data
            vector = b.EndVector()
        fb.BufferStart(b)
        if vector is not None:
            fb.BufferAddData(b, vector)
        return int(fb.BufferEnd(b))

    def _opcode(self, code: int, custom: str | None, version: int) -> int:
        fb, b = self.fb, self.b
        text = b.CreateString(custom) if custom is not None else None
        fb.OperatorCodeStart(b)
        fb.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, DEPRECATED_CODE_MAX))
        fb.OperatorCodeAddBuiltinCode(b, code)
        if text is not None:
            fb.OperatorCodeAddCustomCode(b, text)
        fb.OperatorCodeAddVersion(b, version)
        return int(fb.OperatorCodeEnd(b))

    def _subgraph(
        self,
        sg: TFLiteSubgraph,
        ops: list[OpPlan],
        buffers: list[int],
        codes: dict[tuple[int, str | None, int], int],
    ) -> int:
        fb, b = self.fb, self.b
        tensors = [self._tensor(t, buffers[i]) for i, t in enumerate(sg.tensors)]
        operators = [
            self._operator(op, plan, codes[(plan.code, plan.custom_code, plan.version)])
            for op, plan in zip(sg.operators, ops)
        ]
        tensors_vec = self._tables(fb.SubGraphStartTensorsVector, tensors)
        operators_vec = self._tables(fb.SubGraphStartOperatorsVector, operators)
        inputs = self._ints(sg.inputs)
        outputs = self._ints(sg.outputs)
        name = b.CreateString(sg.name) if sg.name else None
        fb.SubGraphStart(b)
        fb.SubGraphAddTensors(b, tensors_vec)
        fb.SubGraphAddInputs(b, inputs)
        fb.SubGraphAddOutputs(b, outputs)
        fb.SubGraphAddOperators(b, operators_vec)
        if name is not None:
            fb.SubGraphAddName(b, name)
        return int(fb.SubGraphEnd(b))

    def _tensor(self, t: TFLiteTensor, buffer: int) -> int:
        fb, b = self.fb, self.b
        shape = self._ints(t.shape)
        signature = self._ints(t.signature) if t.signature is not None else None
        name = b.CreateString(t.name)
        quant = self._quant(t) if t.quant is not None else None
        sparsity = self._sparsity(t.sparsity) if t.sparsity is not None else None
        fb.TensorStart(b)
        fb.TensorAddShape(b, shape)
        fb.TensorAddType(b, t.type)
        fb.TensorAddBuffer(b, buffer)
        fb.TensorAddName(b, name)
        if quant is not None:
            fb.TensorAddQuantization(b, quant)
        if t.is_variable:
            fb.TensorAddIsVariable(b, True)
        if sparsity is not None:
            fb.TensorAddSparsity(b, sparsity)
        if signature is not None:
            fb.TensorAddShapeSignature(b, signature)
        if t.has_rank:
            fb.TensorAddHasRank(b, True)
        return int(fb.TensorEnd(b))

    def _quant(self, t: TFLiteTensor) -> int:
        fb, b = self.fb, self.b
        assert t.quant is not None
        scale = self._ints(t.quant.scale, "<f4")
        zero = self._ints(t.quant.zero_point, "<i8")
        fb.QuantizationParametersStart(b)
        fb.QuantizationParametersAddScale(b, scale)
        fb.QuantizationParametersAddZeroPoint(b, zero)
        fb.QuantizationParametersAddQuantizedDimension(b, int(t.quant.axis))
        return int(fb.QuantizationParametersEnd(b))

    def _sparsity(self, sp: TFLiteSparsity) -> int:
        fb, b = self.fb, self.b
        dims = []
        for d in sp.dims:
            segments = indices = None
            if not d.dense:
                assert d.segments is not None and d.indices is not None
                segments = self._index_vector(d.segments)
                indices = self._index_vector(d.indices)
            fb.DimensionMetadataStart(b)
            fb.DimensionMetadataAddFormat(b, 0 if d.dense else 1)  # DENSE / SPARSE_CSR
            fb.DimensionMetadataAddDenseSize(b, int(d.dense_size))
            if segments is not None and indices is not None:
                fb.DimensionMetadataAddArraySegmentsType(b, segments[0])
                fb.DimensionMetadataAddArraySegments(b, segments[1])
                fb.DimensionMetadataAddArrayIndicesType(b, indices[0])
                fb.DimensionMetadataAddArrayIndices(b, indices[1])
            dims.append(int(fb.DimensionMetadataEnd(b)))
        order = self._ints(sp.traversal_order)
        block_map = self._ints(sp.block_map)
        dims_vec = self._tables(fb.SparsityParametersStartDimMetadataVector, dims)
        fb.SparsityParametersStart(b)
        fb.SparsityParametersAddTraversalOrder(b, order)
        fb.SparsityParametersAddBlockMap(b, block_map)
        fb.SparsityParametersAddDimMetadata(b, dims_vec)
        return int(fb.SparsityParametersEnd(b))

    def _index_vector(self, values: np.ndarray) -> tuple[int, int]:
        """A SparseIndexVector union member: the narrowest of Uint8/Uint16/Int32 that fits."""
        fb, b = self.fb, self.b
        top = int(values.max()) if values.size else 0
        low = int(values.min()) if values.size else 0
        if low >= 0 and top < 2**8:
            kind, name, dtype = 3, "Uint8Vector", "u1"
        elif low >= 0 and top < 2**16:
            kind, name, dtype = 2, "Uint16Vector", "<u2"
        else:
            kind, name, dtype = 1, "Int32Vector", "<i4"
        vector = self._ints(values, dtype)
        getattr(fb, f"{name}Start")(b)
        getattr(fb, f"{name}AddValues")(b, vector)
        return kind, int(getattr(fb, f"{name}End")(b))

    def _operator(self, op: TFLiteOperator, plan: OpPlan, opcode_index: int) -> int:
        fb, b = self.fb, self.b
        options = self._options(plan) if plan.table is not None else None
        inputs = self._ints(op.inputs)
        outputs = self._ints(op.outputs)
        intermediates = self._ints(op.intermediates) if op.intermediates else None
        custom = None
        if op.custom_options:
            custom = self._ints(np.frombuffer(bytes(op.custom_options), np.uint8), "u1")
        fb.OperatorStart(b)
        fb.OperatorAddOpcodeIndex(b, opcode_index)
        fb.OperatorAddInputs(b, inputs)
        fb.OperatorAddOutputs(b, outputs)
        if options is not None:
            if plan.union == 1:
                fb.OperatorAddBuiltinOptionsType(b, plan.union_code)
                fb.OperatorAddBuiltinOptions(b, options)
            else:
                fb.OperatorAddBuiltinOptions2Type(b, plan.union_code)
                fb.OperatorAddBuiltinOptions2(b, options)
        if custom is not None:
            fb.OperatorAddCustomOptions(b, custom)
        if intermediates is not None:
            fb.OperatorAddIntermediates(b, intermediates)
        return int(fb.OperatorEnd(b))

    def _options(self, plan: OpPlan) -> int:
        fb, b = self.fb, self.b
        table = plan.table
        # Vectors and strings first: a table cannot be built while another object is open.
        offsets = {}
        for field, value in plan.values:
            if field.kind == "vector":
                offsets[field.name] = int(b.CreateNumpyVector(value))
            elif field.kind == "string":
                offsets[field.name] = int(b.CreateString(value))
        getattr(fb, f"{table}Start")(b)
        for field, value in plan.values:
            add = getattr(fb, f"{table}Add{field.method}")
            add(b, offsets.get(field.name, value))
        return int(getattr(fb, f"{table}End")(b))

    def _signature(self, sig: TFLiteSignature) -> int:
        fb, b = self.fb, self.b

        def maps(names: Mapping[str, int]) -> list[int]:
            made = []
            for name, tensor in names.items():
                text = b.CreateString(name)
                fb.TensorMapStart(b)
                fb.TensorMapAddName(b, text)
                fb.TensorMapAddTensorIndex(b, tensor)
                made.append(int(fb.TensorMapEnd(b)))
            return made

        inputs = self._tables(fb.SignatureDefStartInputsVector, maps(sig.inputs))
        outputs = self._tables(fb.SignatureDefStartOutputsVector, maps(sig.outputs))
        key = b.CreateString(sig.key)
        fb.SignatureDefStart(b)
        fb.SignatureDefAddInputs(b, inputs)
        fb.SignatureDefAddOutputs(b, outputs)
        fb.SignatureDefAddSignatureKey(b, key)
        fb.SignatureDefAddSubgraphIndex(b, sig.subgraph)
        return int(fb.SignatureDefEnd(b))
