"""KServe v2 tensors in Triton's gRPC messages: ``ModelInferRequest`` -> :class:`InferRequest`,
outputs -> ``ModelInferResponse``.

An input's data comes either in ``raw_input_contents`` (one entry per input, in the order of the
inputs: what ``tritonclient.grpc`` sends) or in its typed ``contents`` (``fp32_contents``,
``int64_contents``, ``bytes_contents``...). Raw bytes follow the HTTP binary extension's layout
(little-endian, row-major; BYTES elements each a 4-byte length then the bytes), so the HTTP codec's
helpers decode and encode them: one set of checks and one message for each kind of mistake. Outputs
always go back as ``raw_output_contents``, as Triton's server sends them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ferry.errors import InvalidInputError
from ferry.serving._codec import (
    DATATYPES,
    InferRequest,
    _from_binary,
    _from_json,
    _requested_outputs,
    _tensor_header,
    _to_binary,
    datatype_of,
)

__all__ = ["decode_grpc_request", "encode_grpc_response", "parameters_of"]

#: The typed ``contents`` field that holds each datatype (FP16 and BF16 have none: raw only).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters_of(params: Any) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` (or ``ModelRepositoryParameter``) as the dict
    the HTTP codec gives for its JSON ``parameters``: ``{"sequence_id": 7, "sequence_start":
    True, ...}``."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        kind = value.WhichOneof("parameter_choice")
        out[key] = None if kind is None else getattr(value, kind)
    return out


def decode_grpc_request(request: Any) -> InferRequest:
    """Decode a ``ModelInferRequest``.

    Raw inputs are ``numpy.frombuffer`` views over the message's bytes (read-only).

    Raises:
        InvalidInputError: no inputs, a malformed tensor header, raw contents that do not match
            the inputs (count or size), an input with both or neither of raw and typed contents,
            typed contents of the wrong field or count, or what the HTTP codec refuses.
    """
    if not request.inputs:
        raise InvalidInputError("the request has no inputs: give at least one in 'inputs'")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInputError(
            f"the request has {len(raw)} raw_input_contents for {len(request.inputs)} inputs; "
            "send raw contents for every input (in the order of the inputs) or for none"
        )
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for i, tensor in enumerate(request.inputs):
        name, shape, datatype = _tensor_header(
            {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        )
        if name in inputs:
            raise InvalidInputError(f"input {name!r} is given twice")
        params = parameters_of(tensor.parameters)
        if "shared_memory_region" in params:
            raise InvalidInputError(
                f"input {name!r} names a shared memory region; this server does not support the "
                "shared memory extensions: send the data in the request"
            )
        typed = tensor.HasField("contents") and tensor.contents.ListFields()
        if raw:
            if typed:
                raise InvalidInputError(
                    f"input {name!r} has both typed contents and raw_input_contents; send one"
                )
            data = raw[i]
            inputs[name] = _from_binary(memoryview(data), data, 0, name, datatype, shape)
        elif typed:
            inputs[name] = _from_contents(tensor.contents, name, datatype, shape)
        elif math.prod(shape) == 0:
            inputs[name] = np.empty(shape, DATATYPES[datatype])  # no elements: nothing to send
        else:
            raise InvalidInputError(
                f"input {name!r} has no data: give its typed contents "
                f"({_CONTENTS.get(datatype, 'none for ' + datatype)}) or raw_input_contents"
            )
        datatypes[name] = datatype
    params = parameters_of(request.parameters)
    outputs = _requested_outputs(
        [{"name": o.name, "parameters": parameters_of(o.parameters)} for o in request.outputs]
        if request.outputs
        else None
    )
    return InferRequest(
        id=request.id or None,
        inputs=inputs,
        datatypes=datatypes,
        outputs=outputs,
        binary_output=True,  # gRPC's outputs are always raw
        parameters=params,
    )


def _from_contents(contents: Any, name: str, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    field = _CONTENTS.get(datatype)
    given = [f.name for f, _ in contents.ListFields()]
    if field is None:
        raise InvalidInputError(
            f"input {name!r}: {datatype} has no typed contents in Triton's protocol; send it in "
            "raw_input_contents"
        )
    if given != [field]:
        raise InvalidInputError(
            f"input {name!r} is {datatype}: its data goes in contents.{field}, got "
            f"{', '.join(given)}"
        )
    values = getattr(contents, field)
    if datatype == "BYTES":
        count = math.prod(shape)
        if len(values) != count:
            raise InvalidInputError(
                f"input {name!r}: contents has {len(values)} elements but shape {list(shape)} "
                f"needs {count}"
            )
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    # The HTTP codec's JSON path checks kinds, ranges (INT8 in int_contents) and the count.
    return _from_json(list(values), name, datatype, shape)


def encode_grpc_response(
    response: Any,
    *,
    model_name: str,
    model_version: str,
    outputs: Sequence[tuple[str, np.ndarray]],
    request_id: str | None,
) -> Any:
    """Fill a ``ModelInferResponse`` with the outputs as raw contents.

    Raises:
        InvalidInputError: an output of a dtype the protocol cannot carry.
    """
    response.model_name = model_name
    response.model_version = model_version
    if request_id:
        response.id = request_id
    raw = response.raw_output_contents
    for name, array in outputs:
        datatype = datatype_of(array.dtype)
        tensor = response.outputs.add()
        tensor.name = name
        tensor.datatype = datatype
        tensor.shape.extend(array.shape)
        raw.append(bytes(_to_binary(array, datatype, name)))
    return response
