from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import models
from ferry.errors import ModelLoadError
from ferry.graph import load_model, model_source_path, save_model, summarize


def test_load_from_path_proto_and_ir(mlp_path: Path) -> None:
    from_path = load_model(mlp_path)
    from_proto = load_model(onnx.load(mlp_path))
    assert [n.op_type for n in from_path.graph] == [n.op_type for n in from_proto.graph]
    assert load_model(from_path) is from_path
    assert model_source_path(from_path) == mlp_path.resolve()
    assert model_source_path(from_proto) is None


def test_load_artifact_folder(tmp_path: Path) -> None:
    onnx.save(models.mlp(), tmp_path / "model.onnx")
    assert len(load_model(tmp_path).graph) == 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"\x00garbage" * 50, "not a valid ONNX model"),
        (b"hello world, not a model at all\n", "ONNX"),
    ],
)
def test_corrupt_files_fail_cleanly(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message) as info:
        load_model(path)
    assert "bad.onnx" in str(info.value)


def test_truncated_model_fails_cleanly(tmp_path: Path, mlp_path: Path) -> None:
    data = mlp_path.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated.onnx"):
        load_model(path)


def test_missing_file_and_folder_without_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope.onnx")
    with pytest.raises(ModelLoadError, match="holds no model.onnx"):
        load_model(tmp_path)
    with pytest.raises(ModelLoadError, match="cannot load a model from a int"):
        load_model(3)  # type: ignore[arg-type]


def test_external_data_loads_and_missing_data_is_named(tmp_path: Path) -> None:
    path = models.save_external(models.mlp(), tmp_path / "ext.onnx")
    model = load_model(path)
    w1 = model.graph.initializers["w1"].const_value
    assert isinstance(w1, ir.ExternalTensor)
    np.testing.assert_array_equal(
        w1.numpy(), onnx.numpy_helper.to_array(models.mlp().graph.initializer[0])
    )

    data = tmp_path / "ext.onnx.data"
    data.write_bytes(data.read_bytes()[:10])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(path)
    data.unlink()
    with pytest.raises(ModelLoadError, match=r"ext.onnx.data.*missing"):
        load_model(path)


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path, mlp_path: Path) -> None:
    model = load_model(mlp_path)
    out = tmp_path / "out" / "saved.onnx"
    save_model(model, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["saved.onnx"]
    onnx.checker.check_model(onnx.load(out))

    # A save that fails half-way leaves the existing file as it was.
    before = out.read_bytes()
    broken = load_model(mlp_path)
    broken.graph.initializers["w1"].const_value = _ExplodingTensor(
        broken.graph.initializers["w1"].const_value
    )
    with pytest.raises(Exception, match="serialize"):
        save_model(broken, out)
    assert out.read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["saved.onnx"]


class _ExplodingTensor(ir.Tensor):
    def __init__(self, inner: ir.TensorProtocol) -> None:
        super().__init__(inner.numpy(), name=inner.name)

    def tobytes(self) -> bytes:
        raise RuntimeError("disk full")

    def numpy(self) -> np.ndarray:
        raise RuntimeError("disk full")


def test_save_keeps_external_data_and_does_not_touch_the_source(tmp_path: Path) -> None:
    src = models.save_external(models.mlp(), tmp_path / "src.onnx")
    stamps = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.iterdir()}
    out = save_model(load_model(src), tmp_path / "copy.onnx")
    assert (tmp_path / "copy.onnx.data").is_file()
    assert {
        p.name: (p.stat().st_mtime_ns, p.read_bytes())
        for p in tmp_path.iterdir()
        if p.name.startswith("src")
    } == stamps
    reloaded = onnx.load(out)
    assert onnx.numpy_helper.to_array(reloaded.graph.initializer[0]).shape == (8, 16)
    save_model(load_model(src), tmp_path / "inline.onnx", external_data=False)
    assert not (tmp_path / "inline.onnx.data").exists()
    assert not any(
        name.endswith(".tmp") or name.startswith(".")
        for name in (p.name for p in tmp_path.iterdir())
    )


def test_summary_of_mlp() -> None:
    s = summarize(load_model(models.mlp()))
    assert [(t.name, t.dtype, t.shape) for t in s.inputs] == [("x", "float32", ("batch", 16))]
    assert [(t.name, t.dtype, t.shape) for t in s.outputs] == [("y", "float32", ("batch", 4))]
    assert s.opsets == {"ai.onnx": 17}
    assert s.op_counts == {"Gemm": 1, "Relu": 1, "MatMul": 1, "Softmax": 1}
    assert s.param_count == 8 * 16 + 8 + 8 * 4
    assert s.param_bytes == 4 * s.param_count
    # Gemm 1x16 @ 16x8 and MatMul 1x8 @ 8x4, two FLOPs per multiply-add, batch taken as 1.
    assert s.flops == 2 * 16 * 8 + 2 * 8 * 4
    assert s.flops_unknown_nodes == 0


def test_summary_flops_of_conv_and_conv_transpose() -> None:
    s = summarize(load_model(models.conv()))
    conv = 2 * (8 * 16 * 16) * (3 * 3 * 3)  # each of 8x16x16 outputs: a 3x3x3 dot product
    deconv = 2 * (8 * 16 * 16) * (4 * 2 * 2)  # each input element scatters into 4x2x2 outputs
    assert s.flops == conv + deconv


def test_summary_counts_subgraph_nodes() -> None:
    s = summarize(load_model(models.with_if()))
    assert s.has_subgraphs
    assert s.op_counts["Mul"] == 1 and s.op_counts["Neg"] == 1 and s.op_counts["If"] == 1
    assert s.node_count == 5


def test_summary_of_external_data_model_reads_no_weights(tmp_path: Path) -> None:
    path = models.save_external(models.mlp(), tmp_path / "ext.onnx")
    s = summarize(load_model(path))
    assert s.external_data and s.param_count == 8 * 16 + 8 + 8 * 4
    d = s.to_dict()
    assert d["inputs"][0] == {"name": "x", "dtype": "float32", "shape": ["batch", 16]}


def test_saved_files_get_normal_permissions(tmp_path: Path, mlp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        out = save_model(load_model(mlp_path), tmp_path / "perm.onnx")
    finally:
        os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o644


def test_save_without_external_data_stands_alone(tmp_path: Path) -> None:
    # external_data=False must read the other file's weights in: saved as they were, the new
    # file would still point at src.onnx.data, relative to wherever it is written.
    src = models.save_external(models.mlp(), tmp_path / "src.onnx")
    model = load_model(src)
    (tmp_path / "elsewhere").mkdir()
    out = save_model(model, tmp_path / "elsewhere" / "inline.onnx", external_data=False)
    assert sorted(p.name for p in out.parent.iterdir()) == ["inline.onnx"]
    (tmp_path / "src.onnx.data").unlink()
    again = load_model(out)
    assert not any(
        isinstance(v.const_value, ir.ExternalTensor) for v in again.graph.initializers.values()
    )
    assert again.graph.initializers["w1"].const_value.numpy().shape == (8, 16)
    # The model given keeps its external references.
    assert isinstance(model.graph.initializers["w1"].const_value, ir.ExternalTensor)
