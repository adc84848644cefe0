"""Fuzzing the KServe v2 codec (issue 20): whatever a client sends, ``decode_request`` gives back
the arrays the body carries or refuses it with :class:`~ferry.errors.InvalidInputError` (which the
server answers with 400), never another exception, never a hang, never a huge allocation.

The valid bodies are built here from the protocol's text (JSON header, ``binary_data_size``,
``Inference-Header-Content-Length``, little-endian tensors, 4-byte-length BYTES elements), not with
the codec, so that a round trip checks the codec against the protocol rather than against itself;
``test_codec.py`` checks the same against Triton's own client on fixed samples. Each property runs a
few hundred derandomized examples (reproducible in CI, no example database) under a per-example
deadline, and inside a wall-clock alarm that turns a real hang into a failure instead of a stuck job.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import tracemalloc
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ferry.errors import InvalidInputError
from ferry.serving import DATATYPES, decode_request, encode_response
from time_bound import bounded

# derandomize: CI runs the same examples every time; database=None: nothing is written to
# .hypothesis/ and no earlier failure is replayed out of order. The deadline is ~1000x what an
# example takes (a few ms): it is there to catch quadratic blow-ups, not to time the codec.
FUZZ = settings(max_examples=400, derandomize=True, database=None, deadline=2000)
# Seconds an example may run before the alarm calls it a hang (a deadline only reports after the
# call returns, which an endless loop never does).
HANG_S = 20.0

JSON_TYPES = [d for d in DATATYPES if d != "BF16"]  # BF16 travels only as binary
WIRE_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def decode_or_refuse(body: bytes | bytearray, header_length: int | None) -> Any:
    """The property every body must keep: a request whose arrays fit their declared datatypes, or
    InvalidInputError with a message. Anything else propagates and fails the example."""
    with bounded(HANG_S):
        try:
            request = decode_request(body, header_length)
        except InvalidInputError as e:
            assert str(e), "a refusal must say what is wrong"
            return None
    for name, array in request.inputs.items():
        assert isinstance(array, np.ndarray), name
        assert array.dtype == DATATYPES[request.datatypes[name]], name
    return request


# ------------------------------------------------------------------- bodies, as a client builds them


@dataclasses.dataclass
class Tensor:
    name: str
    datatype: str
    array: np.ndarray
    binary: bool
    nested: bool = False  # JSON data nested to the shape, or flat


def wire_bytes(array: np.ndarray, datatype: str) -> bytes:
    """The binary tensor data extension: little-endian, row-major; BYTES as length + bytes."""
    if datatype == "BYTES":
        items = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
        return b"".join(struct.pack("<I", len(v)) + v for v in items)
    return np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"))).tobytes()


def json_data(array: np.ndarray, nested: bool) -> Any:
    if array.dtype == object:  # JSON carries BYTES as text
        text = np.empty(array.size, dtype=object)
        text[:] = [v if isinstance(v, str) else v.decode() for v in array.reshape(-1)]
        array = text.reshape(array.shape)
    return array.tolist() if nested else array.reshape(-1).tolist()


def build_request(tensors: list[Tensor], request_id: str | None = None) -> tuple[bytes, int | None]:
    """The body and ``Inference-Header-Content-Length`` a client sends (None: all JSON)."""
    header: dict[str, Any] = {"inputs": []}
    if request_id is not None:
        header["id"] = request_id
    chunks: list[bytes] = []
    for t in tensors:
        entry: dict[str, Any] = {
            "name": t.name,
            "shape": list(t.array.shape),
            "datatype": t.datatype,
        }
        if t.binary:
            raw = wire_bytes(t.array, t.datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = json_data(t.array, t.nested)
        header["inputs"].append(entry)
    # NaN and Infinity written as Python's json (and Triton's client, which uses it) writes them.
    text = json.dumps(header).encode()
    if not chunks:
        return text, None
    return text + b"".join(chunks), len(text)


def parse_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """A client's reading of a response body: the arrays by output name."""
    end = len(body) if header_length is None else header_length
    header = json.loads(body[:end])
    offset, out = end, {}
    for entry in header["outputs"]:
        datatype, shape = entry["datatype"], tuple(entry["shape"])
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is None:
            data = entry["data"]
            if datatype == "BYTES":
                array = np.empty(len(data), dtype=object)
                array[:] = data
                out[entry["name"]] = array.reshape(shape)
            else:
                out[entry["name"]] = np.array(data, dtype=DATATYPES[datatype]).reshape(shape)
            continue
        chunk, offset = body[offset : offset + size], offset + size
        if datatype == "BYTES":
            items, pos = [], 0
            while pos < len(chunk):
                (n,) = struct.unpack_from("<I", chunk, pos)
                items.append(chunk[pos + 4 : pos + 4 + n])
                pos += 4 + n
            array = np.empty(len(items), dtype=object)
            array[:] = items
            out[entry["name"]] = array.reshape(shape)
        else:
            wire = DATATYPES[datatype].newbyteorder("<")
            out[entry["name"]] = (
                np.frombuffer(chunk, wire).astype(DATATYPES[datatype]).reshape(shape)
            )
    assert offset == len(body), "binary_data_size values must add up to the body"
    return out


def assert_same(got: np.ndarray, want: np.ndarray, *, exact_nan: bool) -> None:
    """Same shape, dtype and values, bit for bit; NaNs as NaNs (their payload only when
    ``exact_nan``: JSON's NaN has none)."""
    assert got.shape == want.shape
    if want.dtype == object:
        assert got.dtype == object
        text = [v if isinstance(v, bytes) else v.encode() for v in want.reshape(-1)]
        assert [v if isinstance(v, bytes) else v.encode() for v in got.reshape(-1)] == text
        return
    assert got.dtype == want.dtype.newbyteorder("=")
    want = want.astype(got.dtype)
    bits = WIRE_BITS[want.dtype.itemsize]
    same = got.view(bits) == want.view(bits)
    if want.dtype.kind == "f" or want.dtype == ml_dtypes.bfloat16:
        nan = np.isnan(want.astype(np.float64))
        assert np.array_equal(np.isnan(got.astype(np.float64)), nan)
        if not exact_nan:
            same |= nan
    assert same.all(), (got, want)


# --------------------------------------------------------------------------------- strategies

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
names = st.text(min_size=1, max_size=8)


@st.composite
def arrays(draw: st.DrawFn, datatype: str, binary: bool) -> np.ndarray:
    """Every value of the type: all bit patterns of the floats (NaN payloads, infinities,
    subnormals, -0) when binary; any text, empty included, or any bytes for BYTES."""
    shape = draw(shapes)
    count = int(np.prod(shape))
    if datatype == "BYTES":
        item = st.binary(max_size=24) if binary else st.text(max_size=12)
        values = draw(st.lists(item, min_size=count, max_size=count))
        array = np.empty(count, dtype=object)
        array[:] = values
        return array.reshape(shape)
    dtype = DATATYPES[datatype]
    if dtype.kind == "f" or datatype == "BF16":
        bits = draw(hnp.arrays(WIRE_BITS[dtype.itemsize], shape))
        return bits.view(dtype)
    return draw(hnp.arrays(dtype, shape))


@st.composite
def tensors(draw: st.DrawFn, min_size: int = 1, max_size: int = 4) -> list[Tensor]:
    chosen = draw(st.lists(names, min_size=min_size, max_size=max_size, unique=True))
    out = []
    for name in chosen:
        binary = draw(st.booleans())
        datatype = draw(st.sampled_from(list(DATATYPES) if binary else JSON_TYPES))
        out.append(
            Tensor(name, datatype, draw(arrays(datatype, binary)), binary, draw(st.booleans()))
        )
    return out


# ---------------------------------------------------------------------------------- round trips


@FUZZ
@given(tensors(), st.one_of(st.none(), names), st.booleans(), st.data())
def test_requests_round_trip_and_echo(
    sent: list[Tensor], request_id: str | None, writable: bool, data: st.DataObject
) -> None:
    """A client's body decodes to the same arrays; a server echoing them encodes a body from which
    a client reads them back. Every datatype, JSON and binary, mixed in one body."""
    body, header_length = build_request(sent, request_id)
    with bounded(HANG_S):
        request = decode_request(bytearray(body) if writable else body, header_length)
    assert request.id == request_id
    assert list(request.inputs) == [t.name for t in sent]
    for t in sent:
        assert request.datatypes[t.name] == t.datatype
        assert_same(request.inputs[t.name], t.array, exact_nan=t.binary)

    binary = [data.draw(st.booleans(), label=f"binary output {t.name}") for t in sent]
    outputs = []
    for t, b in zip(sent, binary, strict=True):
        array = request.inputs[t.name]
        if t.datatype == "BYTES" and not b and array.size and isinstance(array.flat[0], bytes):
            b = True  # arbitrary bytes have no JSON form: a server sends them binary
        outputs.append((t.name, array, b))
    with bounded(HANG_S):
        response, length = encode_response(
            model_name="m", model_version="1", outputs=outputs, request_id=request_id
        )
    back = parse_response(response, length)
    for (name, _, b), t in zip(outputs, sent, strict=True):
        assert_same(back[name], t.array, exact_nan=t.binary and (b or t.datatype == "BF16"))


@st.composite
def response_arrays(draw: st.DrawFn) -> tuple[np.ndarray, bool]:
    """Outputs as a model may hand them over: big-endian, strided, numpy strings."""
    binary = draw(st.booleans())
    datatype = draw(st.sampled_from(list(DATATYPES) if binary else JSON_TYPES))
    array = draw(arrays(datatype, binary))
    layout = draw(st.sampled_from(["plain", "big-endian", "strided", "numpy strings"]))
    if layout == "big-endian" and array.dtype.kind in "iuf" and array.dtype.itemsize > 1:
        array = array.astype(array.dtype.newbyteorder(">"))
    elif layout == "strided" and array.ndim:
        array = np.stack([array, array], axis=-1)[..., 0].T  # a strided view, transposed
    elif layout == "numpy strings" and datatype == "BYTES" and array.size:
        kind = "S" if binary else "U"
        if all(v and v[-1:] not in (b"\0", "\0") for v in array.reshape(-1)):
            array = array.astype(kind)  # numpy strips trailing NULs: only values without one
    return array, binary


@FUZZ
@given(st.lists(response_arrays(), min_size=1, max_size=3))
def test_responses_read_back_as_sent(outputs: list[tuple[np.ndarray, bool]]) -> None:
    named = [(f"y{i}", array, binary) for i, (array, binary) in enumerate(outputs)]
    with bounded(HANG_S):
        body, length = encode_response(model_name="m", model_version="1", outputs=named)
    back = parse_response(body, length)
    for name, array, binary in named:
        if array.dtype.kind in "SU":
            array = array.astype(object)
        assert_same(back[name], array, exact_nan=binary or array.dtype == ml_dtypes.bfloat16)


def test_text_without_utf8_is_refused_as_an_output() -> None:
    """A lone surrogate (JSON's "\\ud800", which decodes to a Python str) has no UTF-8 bytes."""
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["\ud800"]}]}
    ).encode()
    echoed = decode_request(body).inputs["x"]
    with pytest.raises(InvalidInputError, match="output 'y' holds text that is not valid Unicode"):
        encode_response(model_name="m", model_version="1", outputs=[("y", echoed, True)])


# ------------------------------------------------------------------- corrupt and hostile bodies


@st.composite
def mutated_bodies(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A valid body, then byte-level damage: flips, cuts, insertions, deletions, duplicated
    chunks, and an ``Inference-Header-Content-Length`` that may lie."""
    body, header_length = build_request(draw(tensors(max_size=3)))
    raw = bytearray(body)
    # Offsets from a Random with a seed hypothesis draws (the same in every run): hypothesis' own
    # integers crowd at the start of a range, the JSON's first bytes, and seldom reach the tensors.
    place = draw(st.randoms(use_true_random=True))
    for _ in range(draw(st.integers(1, 4))):
        if not raw:
            break
        at = place.randrange(len(raw))
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete", "duplicate"]))
        if kind == "flip":
            raw[at] ^= draw(st.integers(1, 255))
        elif kind == "set":
            raw[at] = draw(st.sampled_from([0, 0x22, 0x5B, 0x7B, 0x2D, 0x30, 0x80, 0xC3, 0xFF]))
        elif kind == "cut":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del raw[at : at + draw(st.integers(1, 16))]
        else:
            size, to = draw(st.integers(1, 64)), place.randrange(len(raw) + 1)
            raw[to:to] = raw[at : at + size]
    choice = draw(st.sampled_from(["kept", "whole", "shifted", "any"]))
    if choice == "whole":
        header_length = len(raw)
    elif choice == "shifted" and header_length is not None:
        header_length += draw(st.integers(-8, 8))
    elif choice == "any":
        header_length = draw(
            st.one_of(
                st.none(),
                st.integers(-(2**64), 2**64),
                st.sampled_from([0, -1, len(raw), len(raw) + 1, 2**31, 2**63]),
            )
        )
    return bytes(raw), header_length


@FUZZ
@given(mutated_bodies())
def test_damaged_bodies_decode_or_are_refused(case: tuple[bytes, int | None]) -> None:
    decode_or_refuse(*case)


_PROTOCOL_KEYS = [
    "id", "inputs", "outputs", "parameters", "name", "shape", "datatype", "data",
    "binary_data_size", "binary_data", "binary_data_output", "classification",
    "shared_memory_region",
]  # fmt: skip
# Values chosen to break whoever trusts a field: the wrong JSON type for every field, negative and
# huge integers (shapes, sizes), the non-finite floats Python's json accepts, datatype names.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, -1, 1, 2**31, 2**32, 2**48 + 1, 2**63 - 1, 2**63, 2**64, 10**30])
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(list(DATATYPES)),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.sampled_from(_PROTOCOL_KEYS) | st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


def _places(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON tree a value sits, the root included."""
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _places(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _places(value, (*path, i))


@st.composite
def mutated_headers(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A valid request whose JSON has fields replaced, removed or added, binary data kept: wrong
    types everywhere, binary_data_size that mismatches shape x dtype, negative and huge shapes."""
    sent = draw(tensors(max_size=3))
    body, header_length = build_request(sent)
    end = len(body) if header_length is None else header_length
    header, binary = json.loads(body[:end]), body[end:]
    if draw(st.booleans()):
        header["outputs"] = [{"name": "y", "parameters": {"binary_data": True}}]
        header["parameters"] = {"binary_data_output": False}
    for _ in range(draw(st.integers(1, 3))):
        place = draw(st.sampled_from(list(_places(header))))
        if not place:
            header = draw(json_values)
            continue
        parent: Any = header
        for step in place[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if action == "remove":
            del parent[place[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(_PROTOCOL_KEYS))] = draw(json_values)
        elif action == "add":
            parent.insert(place[-1], draw(json_values))
        else:
            parent[place[-1]] = draw(json_values)
    text = json.dumps(header).encode()
    if not binary and draw(st.booleans()):
        return text, None
    return text + binary, len(text)


@FUZZ
@given(mutated_headers())
def test_wrong_fields_decode_or_are_refused(case: tuple[bytes, int | None]) -> None:
    decode_or_refuse(*case)


@st.composite
def hostile_shapes(draw: st.DrawFn) -> tuple[bytes, int | None, int]:
    """Shapes a client may not send with the data it sends: negative dims, dims past int64, too
    many dims, products that overflow, or up to 2**24 elements with a few bytes of data (an
    allocation sized by the shape would show; kept that small so that a codec which regressed
    costs the test 128 MB, not the machine). Gives the body, its header length and the count."""
    small = st.integers(0, 2**6)
    kind = draw(st.sampled_from(["large", "absurd", "negative", "many dims"]))
    if kind == "large":
        shape = draw(st.lists(st.integers(1, 4), max_size=2))
        big = draw(st.integers(2**10, 2**24)) // int(np.prod(shape))
        shape.insert(draw(st.integers(0, len(shape))), big)
    elif kind == "absurd":  # numpy could not even try to allocate these
        huge = st.one_of(
            st.sampled_from([2**40, 2**48, 2**48 + 1, 2**62, 2**63, 2**64, 10**30]),
            st.integers(2**40, 2**80),
        )
        before, after = draw(st.lists(small, max_size=3)), draw(st.lists(small | huge, max_size=3))
        shape = [*before, draw(huge), *after]
    elif kind == "negative":
        shape = [*draw(st.lists(small, max_size=3)), draw(st.integers(-(2**80), -1))]
    else:
        shape = [draw(st.sampled_from([0, 1]))] * draw(st.integers(33, 70))
    # BYTES half the time: its elements are what a shape-sized allocation would hold.
    datatype = draw(st.just("BYTES") | st.sampled_from(list(DATATYPES)))
    entry: dict[str, Any] = {"name": "x", "shape": shape, "datatype": datatype}
    data = draw(st.binary(max_size=64))
    # JSON data is sized by the data, not the shape: a large shape comes with binary data.
    if datatype != "BF16" and kind != "large" and draw(st.booleans()):
        entry["data"] = [0] * draw(st.integers(0, 8))
        data = b""
    else:
        entry["parameters"] = {"binary_data_size": len(data)}
    text = json.dumps({"inputs": [entry]}).encode()
    count = 1
    for d in shape:
        count *= d
    return text + data, len(text) if "parameters" in entry else None, count


@settings(FUZZ, max_examples=500)
@given(hostile_shapes())
def test_hostile_shapes_are_refused_before_allocating(case: tuple[bytes, int | None, int]) -> None:
    """The element count of a shape is checked against the data before anything is allocated:
    a 2**24-element BYTES shape with 4 bytes of data must not make a 128 MB object array."""
    body, header_length, count = case
    tracemalloc.start()
    try:
        request = decode_or_refuse(body, header_length)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(body) + (1 << 20), f"decoding a {len(body)}-byte body took {peak} bytes"
    if request is not None:
        assert request.inputs["x"].size == count


DEPTHS = [1, 30, 31, 32, 33, 64, 65, 500, 999, 1000, 5000, 100_000, 1_000_000]


@pytest.mark.parametrize("where", ["root", "inputs", "data", "shape", "parameters", "objects"])
def test_deep_nesting_decodes_or_is_refused(where: str) -> None:
    """JSON nested thousands deep (a RecursionError in json's scanner) or past numpy's dims, at
    the root and in each field."""
    for depth in DEPTHS:
        deep = "[" * depth + "1" + "]" * depth
        if where == "root":
            decode_or_refuse(deep.encode(), None)
            continue
        if where == "objects":
            deep = '{"a":' * depth + "1" + "}" * depth
        entry = {"name": "x", "shape": [1], "datatype": "FP32", "data": [1], where: "DEEP"}
        text = json.dumps({"inputs": [entry] if where != "inputs" else "DEEP"})
        if where == "parameters":
            deep = '{"p": ' + deep + "}"
        decode_or_refuse(text.replace('"DEEP"', deep).encode(), None)


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=200),
        st.binary(max_size=64).map(lambda b: b'{"inputs": [' + b + b"]}"),
        st.sampled_from(["utf-16", "utf-32", "utf-8-sig", "latin-1"]).map(
            lambda codec: (
                '{"inputs": [{"name": "\u00e9", "shape": [1], "datatype": "INT8", '
                '"data": [1]}]}'.encode(codec)
            )
        ),
        st.integers(4290, 5000).map(lambda n: b'{"inputs": [], "id": ' + b"9" * n + b"}"),
        st.sampled_from([b"1e999", b"NaN", b"-Infinity", b"\xef\xbb\xbf{}", b"", b" "]),
    ),
    st.one_of(st.none(), st.integers(-2, 300)),
)
def test_non_json_and_strange_encodings_are_refused(body: bytes, header_length: int | None) -> None:
    """Random bytes, non-UTF-8, other Unicode encodings and BOMs, integers longer than Python
    parses (4300 digits), non-finite numbers where an object belongs."""
    decode_or_refuse(body, header_length)


def _every_datatype_body() -> tuple[bytes, int]:
    sent = []
    for i, datatype in enumerate(DATATYPES):
        binary = datatype == "BF16" or i % 2 == 0
        array = np.arange(6).reshape(2, 3).astype(DATATYPES[datatype])
        if datatype == "BYTES":
            array = np.array(["", "a", "b\u00e9", "xyz", "\u20ac", "zz"], dtype=object).reshape(
                2, 3
            )
            if binary:
                array = np.array([v.encode() for v in array.reshape(-1)], dtype=object).reshape(
                    2, 3
                )
        sent.append(Tensor(f"t{i}", datatype, array, binary, nested=i % 3 == 0))
        sent.append(Tensor(f"b{i}", datatype, array, not binary or datatype == "BF16"))
    body, header_length = build_request(sent, "r")
    assert header_length is not None
    return body, header_length


def test_every_cut_of_a_body_decodes_or_is_refused() -> None:
    """Truncation at every offset of a body holding every datatype both ways, with the header
    length the client first sent and with one that fits the cut."""
    body, header_length = _every_datatype_body()
    assert decode_request(body, header_length).id == "r"
    with bounded(120):
        for cut in range(len(body)):
            part = body[:cut]
            decode_or_refuse(part, header_length)
            decode_or_refuse(part, min(header_length, cut))
            decode_or_refuse(part, None)


def test_the_clean_error_is_a_400() -> None:
    """InvalidInputError is what the server answers with 400 (and anything else with 500)."""
    from ferry.serving._app import status_of

    assert status_of(InvalidInputError("x")) == 400
    assert status_of(IndexError("x")) == 500
