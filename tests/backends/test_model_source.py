"""How every engine is handed a model: its file, its bytes, or (past protobuf's limit) a temp file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import ferry
import models
from ferry.backends import _base
from ferry.graph import load_model, save_model


def _mlp() -> ir.Model:
    return ir.from_proto(models.mlp())


def test_a_file_is_read_in_place(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    save_model(_mlp(), path)
    with _base.model_source(load_model(path), path) as (data, file):
        assert data is None and file == path


def test_small_models_go_as_bytes_with_external_weights_read_in(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    save_model(_mlp(), path, external_data=True)
    model = load_model(path)
    with _base.model_source(model) as (data, file):
        assert file is None and data is not None
        inline = ir.from_proto(onnx.load_from_string(data))
    assert not any(
        isinstance(v.const_value, ir.ExternalTensor) for v in inline.graph.initializers.values()
    )
    # The caller's model still points at its external file.
    assert any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )


def test_large_models_go_through_a_temporary_file_that_is_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_base, "INLINE_LIMIT", 0)
    with _base.model_source(_mlp()) as (data, file):
        assert data is None and file is not None and file.is_file()
        assert (file.parent / "model.onnx.data").is_file()
    assert not file.parent.exists()


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_engines_run_models_given_through_a_temporary_file(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    want = ferry.load(_mlp()).run({"x": x})["y"]
    monkeypatch.setattr(_base, "INLINE_LIMIT", 0)
    got = ferry.load(_mlp(), backends=[engine], cache_dir=False).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
