"""Inputs found, not guessed (issue 31): ``ferry run --random`` with no ``--shape`` on kit models
whose inputs a guess gets wrong (a recognizer's height, a BERT's ids and token types, a VITS
voice's lengths and scales). Each test fails if sizes go back to 224 or ids to [0, 10).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from ferry.cli.main import cli
from ferry.runtime import found_inputs, random_feeds, spec_of

ONNX_OF = Callable[[str], Path]

#: What ``ferry run --random`` must say it found, per model.
EXPECTED = {
    "minilm_l3": ("input_ids 1x32", "ids in [0, 30522)", "attention_mask 1x32", "a mask"),
    "svtrv2": ("image 1x3x48x320", "a text line"),
    "piper_tts": ("input_lengths 1 (the sequence length)", "ones (a knob)", "ids in [0, 256)"),
    "ppocr_rec_paddle": ("x 1x3x48x320", "a text line"),
}


def _ferry(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def _open_sides(path: Path, out: Path) -> Path:
    """The model with its input's height and width open, as paddle2onnx exports a recognizer
    given no shape: ``x [batch, 3, h, w]`` (ferry's conversion pins the height it was shown)."""
    model = ir.load(path)
    value = model.graph.inputs[0]
    value.shape = ir.Shape(["batch", 3, "h", "w"])
    for node in model.graph:
        for output in node.outputs:
            if output.shape is not None:
                output.shape = None  # what followed from the pinned height
    for output in model.graph.outputs:
        output.shape = None
    ir.save(model, out)
    return out


@pytest.mark.parametrize("mid", list(EXPECTED))
def test_run_random_finds_inputs_that_run(mid: str, onnx_file: ONNX_OF, tmp_path: Path) -> None:
    path = onnx_file(mid)
    if mid == "ppocr_rec_paddle":
        path = _open_sides(path, tmp_path / "rec.onnx")
        # The class of bug: at the guessed 224x224 a Concat inside fails.
        model = ir.load(path)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        with pytest.raises(Exception, match="Concat"):  # ORT raises its own types
            session.run(None, random_feeds([spec_of(v) for v in model.graph.inputs]))
    code, out, err = _ferry("run", path, "--random")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("inputs: "))
    for words in EXPECTED[mid]:
        assert words in line, line


def test_token_types_stay_within_their_two_rows(minilm_with_token_types: Path) -> None:
    """A BERT export with ``token_type_ids`` as an input (a table of 2 rows): ids guessed in
    [0, 10) fail "indices element out of data bounds"; found ones are 0 or 1."""
    model = ir.load(minilm_with_token_types)
    specs = [spec_of(v) for v in model.graph.inputs]
    session = ort.InferenceSession(str(minilm_with_token_types), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="out of"):  # ORT raises its own types
        session.run(None, random_feeds(specs, {s.name: (1, 32) for s in specs}))
    found = found_inputs(minilm_with_token_types)
    assert set(np.unique(found.feeds["token_type_ids"])) <= {0, 1}
    assert "token_type_ids 1x32" in found.how
    code, _, err = _ferry("run", minilm_with_token_types, "--random")
    assert code == 0, err


@pytest.fixture
def minilm_with_token_types(onnx_file: ONNX_OF, tmp_path: Path) -> Path:
    """The kit's MiniLM with its token-type embedding's indices taken from a third input."""
    model = ir.load(onnx_file("minilm_l3"))
    gather = next(n for n in model.graph if n.name.endswith("token_type_embeddings/Gather"))
    ids = next(v for v in model.graph.inputs if v.name == "input_ids")
    types = ir.Value(name="token_type_ids", type=ids.type, shape=ir.Shape(list(ids.shape or ())))
    model.graph.inputs.append(types)
    gather.replace_input_with(1, types)
    ir.save(model, tmp_path / "minilm_types.onnx")
    return tmp_path / "minilm_types.onnx"
