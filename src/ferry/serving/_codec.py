"""KServe v2 (Open Inference Protocol) tensors on the wire: JSON and the binary tensor data extension.

A request body is a JSON object, optionally followed by raw tensor bytes; the header
``Inference-Header-Content-Length`` then says where the JSON ends, and each binary input carries
``"parameters": {"binary_data_size": N}``, its bytes following in the order of the inputs. Binary
tensors are little-endian, row-major and unpadded; BOOL is one byte (0 or 1); BYTES is a sequence of
elements, each a 4-byte little-endian length then the bytes. BF16 travels only as binary (JSON
numbers cannot say which bits were meant); it is held as ``ml_dtypes.bfloat16``.

Decoding never copies binary tensors: the arrays are ``numpy.frombuffer`` views over the body.
Encoding copies each output once, into the response body. Every malformed request raises
:class:`~ferry.errors.InvalidInputError` with a message that names the input and what is wrong, which
the server answers with 400.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import sys
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ferry.errors import InvalidInputError

__all__ = [
    "DATATYPES",
    "InferRequest",
    "RequestedOutput",
    "datatype_of",
    "decode_request",
    "encode_response",
]

#: KServe v2 datatype name -> the numpy dtype that holds it (little-endian on the wire).
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items() if name != "BYTES"}
_LITTLE = sys.byteorder == "little"
_LENGTH = struct.Struct("<I")
# JSON numbers that fit each kind: a float datatype takes ints too, an int datatype only ints.
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
# numpy 1 holds at most 32 dims (numpy 2: 64); no model takes more. Past either, reshape fails.
_MAX_DIMS = 32
# A shape whose non-zero dims multiply past this is refused before anything is allocated: numpy
# cannot make such an array even with a 0 dim beside them, and no request body carries one.
_MAX_ELEMENTS = 2**48


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The KServe v2 datatype name of a numpy dtype: ``float32`` -> ``"FP32"``, strings -> ``"BYTES"``.

    Raises:
        InvalidInputError: a dtype the protocol cannot carry (complex, float8, int4...).
    """
    name = _BY_DTYPE.get(dtype)
    if name is not None:
        return name
    if dtype.kind in "OSU":
        return "BYTES"
    if dtype.byteorder not in "=|" and dtype.newbyteorder("=") in _BY_DTYPE:
        return _BY_DTYPE[dtype.newbyteorder("=")]
    raise InvalidInputError(
        f"dtype {dtype} has no KServe v2 datatype; the protocol carries {', '.join(DATATYPES)}"
    )


@dataclasses.dataclass(frozen=True)
class RequestedOutput:
    """An entry of the request's ``outputs``: a name, and whether to send it as binary."""

    name: str
    binary: bool | None  # None: not said, the request's binary_data_output decides


@dataclasses.dataclass
class InferRequest:
    """A decoded inference request.

    Attributes:
        id: the request's ``id``, echoed in the response; None when not given.
        inputs: the input arrays by name, in request order. BYTES inputs are object arrays of
            ``bytes`` (binary) or ``str`` (JSON).
        datatypes: the datatype name each input was sent as.
        outputs: the outputs asked for, or None for all of them.
        binary_output: the request-level ``binary_data_output`` parameter.
        parameters: the request-level parameters as sent.
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    outputs: list[RequestedOutput] | None
    binary_output: bool
    parameters: dict[str, Any]


def decode_request(body: bytes | bytearray, header_length: int | None = None) -> InferRequest:
    """Decode a request body.

    Args:
        body: the whole body. Binary inputs become views over it: keep it alive and unchanged while
            the arrays are in use (a ``bytearray`` gives writable arrays).
        header_length: the ``Inference-Header-Content-Length`` header: the size of the JSON part.
            None means the whole body is JSON.

    Raises:
        InvalidInputError: malformed JSON, a missing or ill-typed field, an unknown datatype, data
            that does not fit the shape, or binary sizes that do not add up to the body.
    """
    size = len(body)
    if header_length is None:
        header_length = size
    elif not 0 <= header_length <= size:
        raise InvalidInputError(
            f"Inference-Header-Content-Length is {header_length} but the body has {size} bytes"
        )
    try:
        request = json.loads(bytes(body[:header_length]) if header_length < size else body)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"the request is not valid JSON: {e}") from None
    except RecursionError:
        # json's C scanner recurses once per nesting level: "[[[[..." a few thousand deep.
        raise InvalidInputError("the request's JSON is nested too deeply") from None
    if not isinstance(request, dict):
        raise InvalidInputError("the request must be a JSON object with an 'inputs' list")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInputError(f"'id' must be a string, got {_json_type(request_id)}")
    parameters = _parameters(request, "the request")
    raw_inputs = request.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInputError("the request must have a non-empty 'inputs' list")
    view = memoryview(body)
    offset = header_length
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for entry in raw_inputs:
        name, shape, datatype = _tensor_header(entry)
        if name in inputs:
            raise InvalidInputError(f"input {name!r} is given twice")
        params = _parameters(entry, f"input {name!r}")
        if "shared_memory_region" in params:
            raise InvalidInputError(
                f"input {name!r} names a shared memory region; this server does not support the "
                "shared memory extensions: send the data in the request"
            )
        binary_size = params.get("binary_data_size")
        if binary_size is not None:
            if type(binary_size) is not int or binary_size < 0:
                raise InvalidInputError(
                    f"input {name!r}: binary_data_size must be a non-negative integer, "
                    f"got {binary_size!r}"
                )
            if "data" in entry:
                raise InvalidInputError(
                    f"input {name!r} has both 'data' and binary_data_size; send one of them"
                )
            end = offset + binary_size
            if end > size:
                raise InvalidInputError(
                    f"input {name!r}: binary_data_size {binary_size} runs past the end of the "
                    f"body ({size - offset} bytes of binary data left)"
                )
            inputs[name] = _from_binary(view[offset:end], body, offset, name, datatype, shape)
            offset = end
        elif "data" in entry:
            inputs[name] = _from_json(entry["data"], name, datatype, shape)
        else:
            raise InvalidInputError(
                f"input {name!r} has no data: give 'data' or send it as binary with "
                "parameters.binary_data_size"
            )
        datatypes[name] = datatype
    if offset != size:
        raise InvalidInputError(
            f"the body has {size - offset} bytes after the inputs' binary data; the "
            "binary_data_size parameters must add up to the body after the JSON header"
        )
    return InferRequest(
        id=request_id,
        inputs=inputs,
        datatypes=datatypes,
        outputs=_requested_outputs(request.get("outputs")),
        binary_output=_flag(parameters, "binary_data_output", "the request"),
        parameters=parameters,
    )


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else "null"
    )


def _parameters(entry: dict[str, Any], what: str) -> dict[str, Any]:
    params = entry.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInputError(f"{what}: 'parameters' must be an object, got {_json_type(params)}")
    return params


def _flag(params: dict[str, Any], key: str, what: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInputError(f"{what}: parameter {key!r} must be true or false, got {value!r}")
    return value


def _tensor_header(entry: Any) -> tuple[str, tuple[int, ...], str]:
    if not isinstance(entry, dict):
        raise InvalidInputError(
            f"each input must be an object with name, shape, datatype, got {_json_type(entry)}"
        )
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInputError("each input needs a 'name' (a non-empty string)")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidInputError(
            f"input {name!r}: 'shape' must be a list of non-negative integers, got {shape!r}"
        )
    if len(shape) > _MAX_DIMS:
        raise InvalidInputError(
            f"input {name!r}: 'shape' has {len(shape)} dims; at most {_MAX_DIMS} are supported"
        )
    elements = 1
    for d in shape:  # one dim at a time, so that a product of huge dims stops at once
        elements *= d or 1
        if elements > _MAX_ELEMENTS:
            raise InvalidInputError(
                f"input {name!r}: 'shape' has more than {_MAX_ELEMENTS} elements (its non-zero "
                "dims multiplied); no request carries that much data"
            )
    datatype = entry.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidInputError(
            f"input {name!r}: unknown datatype {datatype!r}; use one of {', '.join(DATATYPES)}"
        )
    return name, tuple(shape), datatype


def _from_binary(
    data: memoryview,
    body: bytes | bytearray,
    offset: int,
    name: str,
    datatype: str,
    shape: tuple[int, ...],
) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_elements(data, count, name).reshape(shape)
    dtype = DATATYPES[datatype]
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise InvalidInputError(
            f"input {name!r}: binary_data_size is {len(data)} bytes but {datatype} shape "
            f"{list(shape)} needs {expected}"
        )
    if datatype == "BOOL":
        raw = np.frombuffer(body, np.uint8, count, offset)
        if raw.size and raw.max() > 1:
            raise InvalidInputError(f"input {name!r}: a BOOL element is a byte 0 or 1")
        return raw.view(np.bool_).reshape(shape)
    wire = dtype if _LITTLE or dtype.itemsize == 1 else dtype.newbyteorder("<")
    array = np.frombuffer(body, wire, count, offset).reshape(shape)
    return array if wire is dtype else array.astype(dtype)


def _bytes_elements(data: memoryview, count: int, name: str) -> np.ndarray:
    # The elements are gathered before the array is made, so that a shape of 10**12 elements
    # with a few bytes of data is refused when the data runs out, not by allocating 8 TB first.
    items: list[bytes] = []
    pos, end = 0, len(data)
    for i in range(count):
        if pos + 4 > end:
            raise InvalidInputError(
                f"input {name!r}: BYTES data ends after {i} of {count} elements; each element is "
                "a 4-byte little-endian length followed by that many bytes"
            )
        (length,) = _LENGTH.unpack_from(data, pos)
        pos += 4
        if pos + length > end:
            raise InvalidInputError(
                f"input {name!r}: BYTES element {i} claims {length} bytes but only "
                f"{end - pos} are left"
            )
        items.append(bytes(data[pos : pos + length]))
        pos += length
    if pos != end:
        raise InvalidInputError(
            f"input {name!r}: {end - pos} bytes are left after {count} BYTES elements; the shape "
            "and binary_data_size disagree"
        )
    out = np.empty(count, dtype=object)
    out[:] = items
    return out


def _from_json(data: Any, name: str, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BF16":
        raise InvalidInputError(
            f"input {name!r}: BF16 data must be sent as binary (binary_data_size), not JSON"
        )
    if not isinstance(data, list):
        data = [data]  # a lone scalar
    if datatype == "BYTES":
        flat = _flatten_strings(data, name)
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
    else:
        try:
            array = np.array(data)
        except ValueError:
            raise InvalidInputError(
                f"input {name!r}: 'data' is a ragged nested list; give a flat list or one nested "
                "to the shape"
            ) from None
        dtype = DATATYPES[datatype]
        if array.size and dtype.kind in "iu" and array.dtype.kind in "fO":
            # Integers past int64 (big UINT64s) make numpy guess float or object: look closer.
            array = _exact_integers(data, name, datatype, dtype)
        if array.size:
            if array.dtype.kind not in _JSON_KINDS[dtype.kind]:
                raise InvalidInputError(
                    f"input {name!r}: {datatype} data must be "
                    f"{'true/false' if dtype.kind == 'b' else 'integers' if dtype.kind in 'iu' else 'numbers'}, "
                    f"got {_describe_kind(array.dtype)}"
                )
            if dtype.kind in "iu" and array.dtype != dtype:
                info = np.iinfo(dtype)
                if array.min() < info.min or array.max() > info.max:
                    raise InvalidInputError(
                        f"input {name!r}: a value is out of the range of {datatype} "
                        f"[{info.min}, {info.max}]"
                    )
        array = array.astype(dtype, copy=False)
    if array.size != count:
        raise InvalidInputError(
            f"input {name!r}: 'data' has {array.size} elements but shape {list(shape)} needs {count}"
        )
    return array.reshape(shape)


def _exact_integers(data: Any, name: str, datatype: str, dtype: np.dtype[Any]) -> np.ndarray:
    values = np.array(data, dtype=object)
    # A sentinel, not None: a JSON null is itself the bad value to report.
    missing = object()
    bad = next((v for v in values.flat if type(v) is not int), missing)
    if bad is not missing:
        raise InvalidInputError(
            f"input {name!r}: {datatype} data must be integers, got {_json_type(bad)} {bad!r}"
        )
    try:
        return np.array(values.tolist(), dtype=dtype)
    except (OverflowError, ValueError):
        info = np.iinfo(dtype)
        raise InvalidInputError(
            f"input {name!r}: a value is out of the range of {datatype} [{info.min}, {info.max}]"
        ) from None


def _describe_kind(dtype: np.dtype[Any]) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "U": "strings"}.get(
        dtype.kind, "mixed values"
    )


def _flatten_strings(data: list[Any], name: str) -> list[str]:
    out: list[str] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            if not isinstance(item, str):
                raise InvalidInputError(
                    f"input {name!r}: BYTES data in JSON must be strings, got {_json_type(item)}"
                )
            out.append(item)
        else:
            stack.pop()
    return out


def encode_response(
    *,
    model_name: str,
    model_version: str,
    outputs: Sequence[tuple[str, np.ndarray, bool]],
    request_id: str | None = None,
) -> tuple[bytes, int | None]:
    """Encode a response body.

    Args:
        model_name: echoed as ``model_name``.
        model_version: echoed as ``model_version``.
        outputs: ``(name, array, binary)`` per output, in the order to send them. BF16 outputs go
            as binary whatever ``binary`` says: JSON cannot carry them.
        request_id: the request's ``id``, echoed when given.

    Returns:
        The body and the length of its JSON part (the ``Inference-Header-Content-Length`` value),
        or None when the body is all JSON.

    Raises:
        InvalidInputError: an output of a dtype the protocol cannot carry, or BYTES that are not
            UTF-8 asked for as JSON.
    """
    header: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        header["id"] = request_id
    entries: list[dict[str, Any]] = []
    buffers: list[Any] = []
    for name, array, binary in outputs:
        datatype = datatype_of(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary or datatype == "BF16":
            raw = _to_binary(array, datatype, name)
            entry["parameters"] = {"binary_data_size": len(raw)}
            buffers.append(raw)
        else:
            entry["data"] = _to_json(array, datatype, name)
        entries.append(entry)
    header["outputs"] = entries
    text = json.dumps(header, separators=(",", ":")).encode()
    if not buffers:
        return text, None
    return b"".join([text, *buffers]), len(text)


def _to_binary(array: np.ndarray, datatype: str, name: str) -> memoryview | bytes:
    if datatype == "BYTES":
        parts: list[bytes] = []
        for item in array.reshape(-1):
            try:
                raw = item if isinstance(item, bytes) else str(item).encode()
            except UnicodeEncodeError:  # a lone surrogate ("\\ud800" in a JSON request's text)
                raise InvalidInputError(
                    f"output {name!r} holds text that is not valid Unicode (a lone surrogate); "
                    "it has no UTF-8 bytes to send"
                ) from None
            parts.append(_LENGTH.pack(len(raw)))
            parts.append(raw)
        return b"".join(parts)
    wire = array.dtype.newbyteorder("<")
    if array.dtype != wire:
        # The wire is little-endian: a big-endian array (">f4", or any on a big-endian host).
        array = array.astype(wire)
    # A byte view of the (contiguous) array: b"".join then copies it once, into the body.
    view: Any = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return memoryview(view)


def _to_json(array: np.ndarray, datatype: str, name: str) -> list[Any]:
    flat = array.reshape(-1)
    if datatype != "BYTES":
        values: list[Any] = flat.tolist()
        return values
    out: list[str] = []
    for item in flat:
        if isinstance(item, bytes):
            try:
                out.append(item.decode())
            except UnicodeDecodeError:
                raise InvalidInputError(
                    f"output {name!r} holds bytes that are not UTF-8 text; ask for it as binary "
                    "(outputs: [{'name': ..., 'parameters': {'binary_data': true}}])"
                ) from None
        else:
            out.append(str(item))
    return out


def _requested_outputs(raw: Any) -> list[RequestedOutput] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidInputError(f"'outputs' must be a list, got {_json_type(raw)}")
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidInputError("each entry of 'outputs' must be an object with a 'name'")
        name = entry["name"]
        if name in seen:
            raise InvalidInputError(f"output {name!r} is asked for twice")
        seen.add(name)
        params = _parameters(entry, f"output {name!r}")
        if params.get("classification"):
            raise InvalidInputError(
                f"output {name!r} asks for classification; this server does not support the "
                "classification extension: ask for the tensor and take the top-k yourself"
            )
        if "shared_memory_region" in params:
            raise InvalidInputError(
                f"output {name!r} names a shared memory region; this server does not support "
                "the shared memory extensions"
            )
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise InvalidInputError(
                f"output {name!r}: binary_data must be true or false, got {binary!r}"
            )
        outputs.append(RequestedOutput(name, binary))
    return outputs
