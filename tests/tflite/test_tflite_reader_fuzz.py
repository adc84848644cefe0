"""Fuzzing the TFLite reader (issue 20) on the kit's real ``.tflite`` files, mutated: every read
either gives a model whose indices all point inside it or raises ModelLoadError naming the file;
never IndexError, struct.error, RecursionError, MemoryError, a native crash or a hang. Mutants
that still read are converted to ONNX (``ferry.convert``), which must succeed or raise a
FerryError.

The mutations are byte flips, truncation, insertion, deletion, zeroed regions and duplicated
chunks anywhere, and, aimed at the flatbuffer's structure, extreme values written over the very
fields the reader reads (table and vector offsets, vtable entries, vector lengths, enum bytes):
their positions are recorded by watching ``flatbuffers.encode.Get`` while the pristine file is read.

The reader is pure Python, so it runs in this process; conversion runs LiteRT (the parity
reference) and ONNX Runtime on the mutant, native code that a corrupt model could crash, so it
runs in a worker process that this test restarts after a crash and reports on. Examples are
derandomized (the same in every CI run) and bounded in time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ferry.errors import ModelLoadError
from ferry.tflite import TFLiteModel, read_tflite
from time_bound import Hang, bounded

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "real"))
import kit_models  # tests/real: where the kit is and what it holds

pytestmark = pytest.mark.real

SOURCE = "mutant.tflite"
# Reading a kit file takes 10-40 ms; an example past this is a hang (the deadline only reports
# after the call returns, which an endless loop never does).
HANG_S = 30.0
# A conversion takes 0.1-1 s (LiteRT and ONNX Runtime included).
CONVERT_HANG_S = 120.0
KIT_IDS = kit_models.ids("tflite")


# ------------------------------------------------------------------------------ the kit files


@functools.cache
def pristine(model_id: str) -> bytes:
    return kit_models.path(model_id).read_bytes()


@functools.cache
def fields(model_id: str) -> tuple[tuple[int, int], ...]:
    """``(position, width)`` of every scalar the reader reads in the pristine file: the offsets,
    lengths and vtable entries that hold the flatbuffer together, and the enums and indices in it.
    """
    import flatbuffers.encode

    seen: dict[int, int] = {}
    real = flatbuffers.encode.Get

    def spy(packer_type: struct.Struct, buf: Any, head: int) -> Any:
        seen.setdefault(head, packer_type.size)
        return real(packer_type, buf, head)

    with mock.patch.object(flatbuffers.encode, "Get", spy):
        read_tflite(pristine(model_id), model_id)
    return tuple(sorted(seen.items()))


@pytest.fixture(scope="module", autouse=True)
def kit() -> None:
    pytest.importorskip("tflite", reason="the TFLite reader needs the 'tflite' schema package")
    if not kit_models.kit_ready():
        pytest.skip(
            f"the real-model kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh "
            "(or set FERRY_KIT to where it is)"
        )
    assert KIT_IDS, "the kit manifest lists no .tflite model"
    for model_id in KIT_IDS:
        assert len(fields(model_id)) > 100, model_id


# ------------------------------------------------------------------------------------ mutants


@dataclasses.dataclass
class Mutant:
    """A kit file and the mutations applied to it, in order (shown when an example fails)."""

    model_id: str
    steps: list[tuple[Any, ...]]
    data: bytes = dataclasses.field(repr=False)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # Hypothesis' printer would otherwise show every field, the file's bytes included.
        printer.text(repr(self))


def _extremes(width: int, position: int, size: int, old: int) -> st.SearchStrategy[int]:
    top = (1 << (8 * width)) - 1
    return st.one_of(
        st.sampled_from(
            [0, 1, 2, 4, top, top - 1, top - 3, top >> 1, (top >> 1) + 1, size, size - position]
        ),
        st.integers(-64, 64).map(lambda d: old + d),  # a near miss: one entry over, one short
        st.integers(0, top),
    ).map(lambda v: v & top)


# Aimed at the structure three times in ten; the rest anywhere in the file.
KINDS = ["field", "field", "field", "flip", "word", "truncate", "insert", "delete", "zero", "dup"]


@st.composite
def mutants(draw: st.DrawFn) -> Mutant:
    model_id = draw(st.sampled_from(KIT_IDS))
    data = bytearray(pristine(model_id))
    known = fields(model_id)
    # Positions come from a plain Random with a seed hypothesis draws (so the same in every run):
    # hypothesis' own integers crowd at the low end of a range, where these files hold raw
    # weights, while their structure lies mostly in the last half.
    place = draw(st.randoms(use_true_random=True))
    steps: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 4))):
        size = len(data)
        if size < 9:
            break
        kind = draw(st.sampled_from(KINDS))
        at = place.randrange(8, size)  # bytes 4..8 are the identifier: keep "TFL3" mostly
        if kind == "field":
            at, width = known[place.randrange(len(known))]
            if at + width > size:
                continue
            fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[width]
            (old,) = struct.unpack_from(fmt, data, at)
            value = draw(_extremes(width, at, size, old))
            struct.pack_into(fmt, data, at, value)
            steps.append((kind, at, width, value))
        elif kind == "flip":
            mask = draw(st.integers(1, 255))
            data[at] ^= mask
            steps.append((kind, at, mask))
        elif kind == "word":  # any aligned 32-bit word: offsets and lengths are aligned
            at -= at % 4
            value = draw(_extremes(4, at, size, 0))
            data[at : at + 4] = struct.pack("<I", value)
            steps.append((kind, at, value))
        elif kind == "truncate":
            del data[at:]
            steps.append((kind, at))
        elif kind == "insert":
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[at:at] = chunk
            steps.append((kind, at, chunk))
        elif kind == "delete":
            n = draw(st.integers(1, 64))
            del data[at : at + n]
            steps.append((kind, at, n))
        elif kind == "zero":
            n = draw(st.integers(1, 1024))
            data[at : at + n] = bytes(len(data[at : at + n]))
            steps.append((kind, at, n))
        else:
            n, to = draw(st.integers(1, 1024)), place.randrange(8, size + 1)
            data[to:to] = data[at : at + n]
            steps.append((kind, at, n, to))
    return Mutant(model_id, steps, bytes(data))


def read_or_refuse(data: bytes) -> TFLiteModel | None:
    """The property: a model whose every index points inside it, or ModelLoadError naming the
    file. Anything else propagates and fails the example."""
    with bounded(HANG_S):
        try:
            model = read_tflite(data, SOURCE)
        except ModelLoadError as e:
            assert SOURCE in str(e), f"the message must name the file: {e}"
            return None
    for sg in model.subgraphs:
        count = len(sg.tensors)
        for op in sg.operators:
            for t in (*op.inputs, *op.outputs, *op.intermediates):
                assert -1 <= t < count, f"subgraph {sg.index} op {op.index} names tensor {t}"
        for t in (*sg.inputs, *sg.outputs):
            assert 0 <= t < count, f"subgraph {sg.index} names tensor {t}"
        for tensor in sg.tensors:
            if tensor.data is not None and tensor.sparsity is None:
                assert tensor.data.shape == tensor.shape, f"tensor {tensor.index}"
            if tensor.quant is not None:
                assert tensor.quant.scale.size == tensor.quant.zero_point.size
    for sig in model.signatures:
        count = len(model.subgraphs[sig.subgraph].tensors)
        assert all(0 <= t < count for t in (*sig.inputs.values(), *sig.outputs.values()))
    return model


# ---------------------------------------------------------------------------------- reading


@settings(
    max_examples=400,
    derandomize=True,
    database=None,
    # ~50x a read of the largest kit file: a walk that a corrupt length made quadratic
    # would exceed it.
    deadline=2000,
)
@given(mutants())
def test_mutated_kit_files_read_or_are_refused(mutant: Mutant) -> None:
    read_or_refuse(mutant.data)


def test_every_truncation_reads_or_is_refused() -> None:
    """Cuts across each whole file (~600 per file), and at every byte of its first and last KB,
    where the root offset, the identifier and (written last by the builder) the root table lie."""
    with bounded(300):
        for model_id in KIT_IDS:
            data = pristine(model_id)
            cuts = {*range(0, len(data), max(1, len(data) // 600)), *range(1024)}
            cuts |= set(range(len(data) - 1024, len(data)))
            for cut in sorted(c for c in cuts if 0 <= c < len(data)):
                read_or_refuse(data[:cut])


def test_pristine_kit_files_read() -> None:
    for model_id in KIT_IDS:
        model = read_or_refuse(pristine(model_id))
        assert model is not None and model.subgraphs[0].operators, model_id


# ------------------------------------------------------------------------------- converting

_WORKER = r"""
import json, logging, os, struct, sys, traceback
# Replies go on a copy of stdout; fd 1 then points at stderr, so that whatever a library prints
# cannot break the protocol.
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
logging.disable(logging.CRITICAL)
import ferry
from ferry.errors import FerryError
replies.write("ready\n")
replies.flush()
while True:
    head = sys.stdin.buffer.read(4)
    if len(head) < 4:
        break
    data = sys.stdin.buffer.read(struct.unpack("<I", head)[0])
    try:
        ferry.convert(data)
        reply = {"outcome": "converted"}
    except FerryError as e:
        reply = {"outcome": "refused", "error": f"{type(e).__name__}: {e}"[:300]}
    except BaseException:
        reply = {"outcome": "bug", "error": traceback.format_exc()}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""


class Converter:
    """A worker process running ``ferry.convert`` on the bytes it is sent; started again after a
    native crash, which is then reported with the last lines the worker wrote on stderr."""

    def __init__(self, stderr: IO[bytes]) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr = stderr

    def start(self) -> subprocess.Popen[bytes]:
        self.stderr.seek(0)
        self.stderr.truncate()
        process = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
        self.process = process
        assert self._line(CONVERT_HANG_S) == "ready", (
            f"the conversion worker did not start: {self._tail()}"
        )
        return process

    def convert(self, data: bytes) -> dict[str, str]:
        process = self.process if self.process and self.process.poll() is None else self.start()
        assert process.stdin is not None
        try:
            process.stdin.write(struct.pack("<I", len(data)) + data)
            process.stdin.flush()
            line = self._line(CONVERT_HANG_S)
        except BrokenPipeError:  # it died before reading it all
            line = ""
        if line:
            reply: dict[str, str] = json.loads(line)
            return reply
        code = process.wait(5)
        self.close()
        raise AssertionError(
            f"converting the mutant killed the process (exit {code}"
            f"{f', signal {signal.Signals(-code).name}' if code < 0 else ''}): {self._tail()}"
        )

    def _line(self, seconds: float) -> str:
        assert self.process is not None and self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], seconds)
        if not ready:
            self.close()
            raise Hang(f"the conversion gave no answer in {seconds} s: a hang")
        return self.process.stdout.readline().decode().strip()

    def _tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    pipe.close()
            self.process = None


@pytest.fixture(scope="module")
def converter() -> Iterator[Converter]:
    with tempfile.TemporaryFile() as stderr:
        worker = Converter(stderr)
        try:
            yield worker
        finally:
            worker.close()


@settings(
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=None,  # a conversion's time depends on the model; CONVERT_HANG_S bounds it instead
    # Most mutants of a flatbuffer do not read (the reading test covers those); this one wants
    # those that do, so filtering most away is its point, not a slow strategy.
    suppress_health_check=[HealthCheck.filter_too_much],
)
@given(mutants())
def test_mutants_that_read_convert_or_are_refused(converter: Converter, mutant: Mutant) -> None:
    assume(read_or_refuse(mutant.data) is not None)
    reply = converter.convert(mutant.data)
    assert reply["outcome"] != "bug", f"converting raised a non-FerryError:\n{reply['error']}"
