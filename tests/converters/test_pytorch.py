"""The PyTorch converter: modules, torch.export programs, TorchScript and checkpoints -> ONNX,
each checked on ONNX Runtime against torch itself."""

from __future__ import annotations

import functools
import os
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ferry  # noqa: E402
from ferry.converters import Converted, ConvertOptions, PyTorchConverter  # noqa: E402
from ferry.errors import (  # noqa: E402
    BackendUnavailableError,
    ConversionError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)
from ferry.zoo import example_inputs  # noqa: E402
from ferry.zoo._models import torch_module  # noqa: E402

pytestmark = pytest.mark.torch

CONVERTER = PyTorchConverter()


def convert(source: Any, **options: Any) -> Converted:
    return CONVERTER.convert(source, ConvertOptions(**options))


def run_onnx(converted: Converted, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    outputs = ferry.load(converted.model).run(dict(feeds))
    return [outputs[v.name] for v in converted.model.graph.outputs]


def run_torch(module: Any, *args: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        out = module(*(torch.from_numpy(a) for a in args))
    leaves = torch.utils._pytree.tree_leaves(out)
    return [t.numpy() for t in leaves]


def assert_close(got: list[np.ndarray], want: list[np.ndarray], atol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=atol, rtol=1e-4)


def dims(value: Any) -> list[int | str | None]:
    return [d if isinstance(d, int) else d.value for d in value.shape]


# --------------------------------------------------------------------------------------------
# nn.Module
# --------------------------------------------------------------------------------------------


def test_cnn_with_a_dynamic_batch_traced_at_batch_1() -> None:
    module = torch_module("digits_cnn")
    (x1,) = example_inputs("digits_cnn", batch=1).values()
    converted = convert(module, example_inputs={"x": x1}, dynamic_axes={"x": {0: "batch"}})

    (inp,), (out,) = converted.model.graph.inputs, converted.model.graph.outputs
    assert (inp.name, dims(inp)) == ("x", ["batch", 1, 8, 8])
    assert (out.name, dims(out)) == ("output", ["batch", 10])
    assert converted.sample_inputs is not None and converted.reference is not None
    np.testing.assert_array_equal(converted.sample_inputs["x"], x1)
    # The reference is torch on the same inputs, flattened in ONNX output order.
    assert_close(converted.reference({"x": x1}), run_torch(module, x1))

    (x3,) = example_inputs("digits_cnn", batch=3, seed=1).values()
    assert_close(run_onnx(converted, {"x": x3}), run_torch(module, x3))


def test_transformer_block_traced_at_batch_2_runs_at_batch_3() -> None:
    module = torch_module("transformer_block")
    (x2,) = example_inputs("transformer_block", batch=2).values()
    converted = convert(module, example_inputs=(x2,), dynamic_axes={"x": {0: "batch"}})
    assert dims(converted.model.graph.inputs[0]) == ["batch", 16, 64]

    (x3,) = example_inputs("transformer_block", batch=3, seed=1).values()
    assert_close(run_onnx(converted, {"x": x3}), run_torch(module, x3))


def test_mobilenet_through_ferry_convert_passes_parity() -> None:
    module = torch_module("mobilenet_v2")
    (x,) = example_inputs("mobilenet_v2", batch=2).values()
    result = ferry.convert(module, example_inputs=x, dynamic_axes={"x": {0: "N"}})
    assert result.converter == "pytorch" and result.parity.passed
    assert dims(result.model.graph.outputs[0]) == ["N", 10]
    x5 = np.random.default_rng(3).standard_normal((5, 3, 32, 32)).astype(np.float32)
    got = ferry.load(result.model).run({"x": x5})["output"]
    assert_close([got], run_torch(module, x5))


class TwoHeads(torch.nn.Module):
    """Two inputs (one keyword-only, used out of order), nested tuple/dict outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.image = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.table = torch.nn.Linear(5, 4)

    def forward(self, image: torch.Tensor, *, features: torch.Tensor) -> Any:
        pooled = self.image(image).mean(dim=(2, 3))
        embedded = self.table(features)
        return {"logits": pooled + embedded, "parts": (pooled, torch.relu(embedded))}


def test_multiple_inputs_and_outputs_keep_their_names_and_order() -> None:
    module = TwoHeads().eval()
    rng = np.random.default_rng(0)
    image = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    features = rng.standard_normal((2, 5)).astype(np.float32)
    converted = convert(
        module,
        example_inputs={"features": features, "image": image},
        dynamic_axes={"image": {0: "batch"}, "features": {0: "batch"}},
    )
    graph = converted.model.graph
    assert [v.name for v in graph.inputs] == ["image", "features"]
    assert [v.name for v in graph.outputs] == ["logits", "parts_0", "parts_1"]

    feeds = {
        "image": rng.standard_normal((3, 3, 6, 6)).astype(np.float32),
        "features": rng.standard_normal((3, 5)).astype(np.float32),
    }
    with torch.no_grad():
        out = module(torch.from_numpy(feeds["image"]), features=torch.from_numpy(feeds["features"]))
    want = [out["logits"].numpy(), out["parts"][0].numpy(), out["parts"][1].numpy()]
    assert_close(run_onnx(converted, feeds), want)
    assert converted.reference is not None
    assert_close(converted.reference(feeds), want, atol=0)


class BatchBranch(torch.nn.Module):
    """Looks at its batch size: torch.export fixes a dim it only saw at 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return x * 2
        return x * 3


def test_a_dim_fixed_at_size_1_is_traced_again_at_size_2() -> None:
    x1 = np.ones((1, 4), np.float32)
    converted = convert(BatchBranch(), example_inputs=x1, dynamic_axes={"x": {0: "batch"}})
    assert dims(converted.model.graph.inputs[0]) == ["batch", 4]
    assert any("size 2" in note for note in converted.notes)
    x3 = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert_close(run_onnx(converted, {"x": x3}), run_torch(BatchBranch(), x3))


class FixedBatch(torch.nn.Module):
    """Adds a [2, 3] tensor: the batch can only be 2."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.ones(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


def test_a_dim_the_code_fixes_cannot_be_made_dynamic() -> None:
    with pytest.raises(ConversionError, match=r"x\[0\] = 2"):
        convert(
            FixedBatch(), example_inputs=np.ones((2, 3), np.float32), dynamic_axes={"x": {0: "b"}}
        )


class Dropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.linear(x))


def test_a_module_in_training_mode_is_exported_for_inference_and_left_as_it_was() -> None:
    module = Dropout().train()
    x = np.ones((8, 4), np.float32)
    converted = convert(module, example_inputs=x)
    assert module.training and module.drop.training
    assert not any(n.op_type == "Dropout" for n in converted.model.graph)
    assert converted.reference is not None
    want = converted.reference({"x": x})  # deterministic: eval mode, no dropout
    assert_close(run_onnx(converted, {"x": x}), want)
    assert module.training


def test_input_shapes_alone_give_float_examples_and_symbolic_dims() -> None:
    module = torch_module("mlp")
    result = ferry.convert(module, input_shapes={"x": ("batch", 64)}, opset=17)
    assert result.parity.passed
    assert result.model.opset_imports[""] == 17
    assert dims(result.model.graph.inputs[0]) == ["batch", 64]


def test_a_module_without_example_inputs_is_refused_with_how_to_pass_them() -> None:
    with pytest.raises(InvalidInputError, match=r"needs example inputs.*example_inputs.*\(x\)"):
        convert(torch_module("mlp"))
    with pytest.raises(InvalidInputError, match=r"'y'.*inputs are: x"):
        convert(torch_module("mlp"), example_inputs={"y": np.ones((1, 64), np.float32)})


# --------------------------------------------------------------------------------------------
# Unsupported ops: every one is listed
# --------------------------------------------------------------------------------------------


@functools.cache
def custom_ops() -> tuple[Any, Any]:
    """Two custom ops with no ONNX translation (registered once per process)."""

    @torch.library.custom_op("ferry_test::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @scale.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    @torch.library.custom_op("ferry_test::shift", mutates_args=())
    def shift(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @shift.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    return scale, shift


class CustomOps(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(torch.ops.ferry_test.scale(x))
        return torch.ops.ferry_test.shift(y) + torch.ops.ferry_test.scale(y)


def test_custom_ops_without_onnx_translation_are_all_listed() -> None:
    custom_ops()
    with pytest.raises(UnsupportedOpError) as info:
        convert(CustomOps(), example_inputs=np.ones((2, 3), np.float32))
    assert sorted(op for op, _ in info.value.ops) == [
        "ferry_test::scale",
        "ferry_test::scale",
        "ferry_test::shift",
    ]
    message = str(info.value)
    assert "ferry_test::scale x2" in message and "ferry_test::shift x1" in message
    assert "Traceback" not in message


class RankStatistics(torch.nn.Module):
    """ATen ops with no ONNX decomposition in torch 2.13: cummax and kthvalue."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cummax(x, dim=1).values + torch.kthvalue(x, 2, dim=1, keepdim=True).values


def test_aten_ops_without_onnx_translation_are_all_listed() -> None:
    with pytest.raises(UnsupportedOpError) as info:
        convert(RankStatistics(), example_inputs=np.ones((2, 5), np.float32))
    assert {op for op, _ in info.value.ops} == {"aten::cummax", "aten::kthvalue"}
    assert all(node != "?" for _, node in info.value.ops)


def test_custom_ops_in_torchscript_are_all_listed() -> None:
    custom_ops()
    script = torch.jit.script(CustomOps())
    with pytest.raises(UnsupportedOpError) as info:
        convert(script, example_inputs=np.ones((2, 3), np.float32))
    assert sorted(op for op, _ in info.value.ops) == [
        "ferry_test::scale",
        "ferry_test::scale",
        "ferry_test::shift",
    ]


# --------------------------------------------------------------------------------------------
# torch.export programs and .pt2 files
# --------------------------------------------------------------------------------------------


def test_exported_program_keeps_its_dynamic_dim_under_the_requested_name() -> None:
    module = torch_module("digits_cnn")
    (x2,) = example_inputs("digits_cnn", batch=2).values()
    program = torch.export.export(
        module, (torch.from_numpy(x2),), dynamic_shapes={"x": {0: torch.export.Dim("b")}}
    )
    converted = convert(program, dynamic_axes={"x": {0: "batch"}})
    assert dims(converted.model.graph.inputs[0]) == ["batch", 1, 8, 8]
    assert dims(converted.model.graph.outputs[0]) == ["batch", 10]
    # Sample inputs come from the program's own example inputs.
    assert converted.sample_inputs is not None
    np.testing.assert_array_equal(converted.sample_inputs["x"], x2)
    (x3,) = example_inputs("digits_cnn", batch=3, seed=1).values()
    assert converted.reference is not None
    assert_close(run_onnx(converted, {"x": x3}), run_torch(module, x3))
    assert_close(converted.reference({"x": x3}), run_torch(module, x3))


def test_pt2_file_is_loaded_only_when_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = torch_module("transformer_block")
    (x,) = example_inputs("transformer_block", batch=2).values()
    path = tmp_path / "block.pt2"
    torch.export.save(torch.export.export(module, (torch.from_numpy(x),)), path)
    before = path.read_bytes()
    assert CONVERTER.sniff(path)

    with monkeypatch.context() as patch:
        patch.setattr(torch.export, "load", lambda *a, **k: pytest.fail("loaded untrusted"))
        with pytest.raises(ModelLoadError, match=r"torch.export archive.*--trust-pickle"):
            convert(path)

    result = ferry.convert(path, trust_pickle=True)
    assert result.parity.passed and result.converter == "pytorch"
    assert dims(result.model.graph.inputs[0]) == [2, 16, 64]
    assert path.read_bytes() == before


# --------------------------------------------------------------------------------------------
# TorchScript
# --------------------------------------------------------------------------------------------


def test_traced_torchscript_file_with_a_dynamic_batch(tmp_path: Path) -> None:
    module = torch_module("digits_cnn")
    (x2,) = example_inputs("digits_cnn", batch=2).values()
    path = tmp_path / "cnn.pt"
    torch.jit.save(torch.jit.trace(module, torch.from_numpy(x2)), path)
    assert CONVERTER.sniff(path)
    with pytest.raises(ModelLoadError, match=r"TorchScript.*torch.jit.load.*--trust-pickle"):
        convert(path, example_inputs={"x": x2})

    converted = convert(
        path, example_inputs={"x": x2}, dynamic_axes={"x": {0: "batch"}}, trust_pickle=True
    )
    assert [v.name for v in converted.model.graph.inputs] == ["x"]
    assert dims(converted.model.graph.outputs[0]) == ["batch", 10]
    (x3,) = example_inputs("digits_cnn", batch=3, seed=1).values()
    assert_close(run_onnx(converted, {"x": x3}), run_torch(module, x3))


class SignBranch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.linear(x) if bool(x.sum() > 0) else -x  # TorchScript: a prim::If
        return z, z * y


def test_scripted_control_flow_takes_both_branches_like_torch() -> None:
    script = torch.jit.script(SignBranch().eval())
    ones = np.ones((2, 4), np.float32)
    converted = convert(
        script, example_inputs=(ones, ones), dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}
    )
    assert [v.name for v in converted.model.graph.inputs] == ["x", "y"]
    assert [v.name for v in converted.model.graph.outputs] == ["output_0", "output_1"]
    assert any(n.op_type == "If" for n in converted.model.graph)
    y = np.full((3, 4), 0.5, np.float32)
    for x in (np.ones((3, 4), np.float32), -np.ones((3, 4), np.float32)):
        assert_close(run_onnx(converted, {"x": x, "y": y}), run_torch(script, x, y))


# --------------------------------------------------------------------------------------------
# torch.save checkpoints: never unpickled unless trusted
# --------------------------------------------------------------------------------------------


class MakesDirectoryWhenUnpickled:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (str(self.path),))


def test_pickled_module_is_refused_untrusted_and_converted_trusted(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    module = torch_module("digits_cnn")
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": module, "hook": MakesDirectoryWhenUnpickled(marker), "epoch": 3}, path)
    assert CONVERTER.sniff(path)
    (x,) = example_inputs("digits_cnn", batch=2).values()

    with pytest.raises(ModelLoadError, match=r"DigitsCNN.*--trust-pickle") as info:
        convert(path, example_inputs=x)
    assert "arbitrary code" in str(info.value)
    assert not marker.exists()

    result = ferry.convert(path, example_inputs=x, trust_pickle=True)
    assert marker.exists()  # trusted: really unpickled
    assert result.parity.passed
    assert any("'model'" in note for note in result.notes)


def test_a_state_dict_is_not_a_model(tmp_path: Path) -> None:
    path = tmp_path / "weights.pth"
    torch.save(torch_module("mlp").state_dict(), path)
    legacy = tmp_path / "legacy.pth"
    torch.save(torch_module("mlp").state_dict(), legacy, _use_new_zipfile_serialization=False)
    for file in (path, legacy):
        assert CONVERTER.sniff(file)
        for trust in (False, True):
            with pytest.raises(ModelLoadError, match=r"state_dict.*model's Python class"):
                convert(file, example_inputs=np.ones((1, 64), np.float32), trust_pickle=trust)


# --------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------


def test_sniff_and_accepts(tmp_path: Path) -> None:
    other = tmp_path / "other.pt"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("notes/readme.txt", "not torch")
    text = tmp_path / "text.pth"
    text.write_text("hello")
    assert not CONVERTER.sniff(other) and not CONVERTER.sniff(text)
    assert not CONVERTER.sniff(tmp_path)
    with pytest.raises(ModelLoadError, match="not a PyTorch file"):
        convert(other, trust_pickle=True)

    module = torch_module("mlp")
    assert CONVERTER.accepts(module)
    assert CONVERTER.accepts(torch.jit.script(module))
    assert not CONVERTER.accepts(torch.ones(2))
    assert not CONVERTER.accepts(np.ones(2))
    assert not CONVERTER.accepts("model.pt")


def test_without_torch_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(BackendUnavailableError, match=r"pip install 'ferry\[torch\]'"):
        CONVERTER.convert(tmp_path / "model.pt", ConvertOptions())


def test_exported_programs_dims_get_names_not_torch_symbols(tmp_path: Path) -> None:
    """An ExportedProgram keeps no ``Dim`` names, only torch's symbols (s43): ferry names them."""
    import torch

    class Scale(torch.nn.Module):
        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return torch.relu(image) * 2

    batch, side = torch.export.Dim("batch", max=64), torch.export.Dim("side", max=1024)
    program = torch.export.export(
        Scale(),
        (torch.randn(2, 3, 16, 16),),
        dynamic_shapes={"image": {0: batch, 2: side, 3: side}},
    )
    result = ferry.convert(program)
    (image,) = result.model.graph.inputs
    assert [getattr(d, "value", d) for d in image.shape] == ["batch", 3, "image_dim2", "image_dim2"]
    assert any("renamed" in note for note in result.notes)
    # Names the user gives win.
    named = ferry.convert(program, input_shapes={"image": ("n", 3, "h", "h")})
    assert [getattr(d, "value", d) for d in named.model.graph.inputs[0].shape] == ["n", 3, "h", "h"]
