"""ferry.convert's own machinery: converter choice, opset + checker, and the parity check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner

import ferry
import models
from ferry.cli.main import cli
from ferry.converters import (
    Converted,
    OnnxConverter,
    ParityError,
    get_converter,
    resolve_converter,
)
from ferry.converters._convert import _aligned
from ferry.errors import ConversionError, InvalidInputError, ModelLoadError


def test_onnx_conversion_is_verified_against_the_original(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), path)
    result = ferry.convert(path, opset=21)
    assert result.converter == "onnx"
    assert result.model.opset_imports[""] == 21
    assert result.parity.passed and result.parity.skipped is None
    (out,) = result.parity.outputs
    assert out.name == "y" and out.max_abs_error < 1e-6 and (out.atol, out.rtol) == (1e-4, 1e-3)
    saved = result.save(tmp_path / "out.onnx")
    assert onnx.load(saved).opset_import[0].version == 21


def test_in_memory_model_is_left_unchanged() -> None:
    model = ir.from_proto(models.mlp())
    before = ir.to_proto(model).SerializeToString()
    result = ferry.convert(model, opset=15)
    assert result.model is not model and result.model.opset_imports[""] == 15
    assert ir.to_proto(model).SerializeToString() == before


def test_verify_off_is_reported_as_skipped() -> None:
    result = ferry.convert(models.mlp(), verify=False)
    assert not result.parity.passed and result.parity.skipped == "verification was turned off"


def test_a_wrong_conversion_fails_loudly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = OnnxConverter.convert

    def off_by_a_bit(self: OnnxConverter, source: object, options: object) -> Converted:
        converted = real(self, source, options)  # type: ignore[arg-type]
        reference = converted.reference
        assert reference is not None
        converted.reference = lambda feeds: {k: v + 0.01 for k, v in reference(feeds).items()}  # type: ignore[union-attr]
        return converted

    monkeypatch.setattr(OnnxConverter, "convert", off_by_a_bit)
    with pytest.raises(ParityError) as info:
        ferry.convert(models.mlp())
    assert "output 'y'" in str(info.value) and "max abs error 0.01" in str(info.value)
    assert not info.value.report.passed
    # A looser tolerance accepts it; the CLI writes nothing when parity fails.
    assert ferry.convert(models.mlp(), tolerance=(0.02, 0.0)).parity.passed
    src = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), src)
    result = CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "out.onnx")])
    assert result.exit_code == 2 and "parity FAILED" in result.stderr
    assert not (tmp_path / "out.onnx").exists()
    result = CliRunner().invoke(
        cli, ["convert", str(src), "-o", str(tmp_path / "out.onnx"), "--tolerance", "0.02"]
    )
    assert result.exit_code == 0 and (tmp_path / "out.onnx").exists()


def test_registry_picks_by_object_suffix_and_name(tmp_path: Path) -> None:
    assert resolve_converter(models.mlp())[0].name == "onnx"
    assert resolve_converter(ir.from_proto(models.mlp()))[0].name == "onnx"
    path = tmp_path / "m.onnx"
    onnx.save(models.mlp(), path)
    assert resolve_converter(path)[0].name == "onnx"
    assert resolve_converter(str(path))[1] == path
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    onnx.save(models.mlp(), artifact / "model.onnx")
    assert resolve_converter(artifact)[0].name == "onnx"
    assert get_converter("torch").name == "pytorch" and get_converter("keras").name == "tensorflow"
    with pytest.raises(ConversionError, match="unknown source format 'caffe'"):
        get_converter("caffe")
    with pytest.raises(ConversionError, match="cannot convert a builtins.dict"):
        resolve_converter({"not": "a model"})
    with pytest.raises(ModelLoadError, match="not found"):
        resolve_converter(tmp_path / "missing.onnx")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConversionError, match="cannot tell which framework"):
        resolve_converter(tmp_path / "notes.txt")


def test_every_registered_converter_imports_without_its_framework() -> None:
    from ferry.converters import converter_names

    for name in converter_names():
        converter = get_converter(name)
        assert converter.name == name and isinstance(converter.suffixes, tuple)
        assert converter.accepts(object()) is False


def test_source_outputs_must_pair_with_the_converted_models() -> None:
    a = np.array([[1.0, 2.0]], np.float32)
    assert _aligned(["y"], {"output_0": a}) == {"output_0": a}  # other name, same count
    with pytest.raises(ConversionError, match="gives 2 outputs"):
        _aligned(["y"], [a, a])
    with pytest.raises(ConversionError, match="mapped them wrongly"):
        _aligned(["y"], {"p": a, "q": a})


def test_report_json_from_cli(tmp_path: Path) -> None:
    import json

    src = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), src)
    result = CliRunner().invoke(
        cli, ["convert", str(src), "-o", str(tmp_path / "o.onnx"), "--opset", "19", "--report", "-"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["converter"] == "onnx" and report["parity"]["passed"] is True
    assert report["parity"]["outputs"][0]["name"] == "y"


# --- example_inputs: one meaning for every converter -----------------------------------------


def test_example_inputs_forms() -> None:
    from ferry.converters._base import example_items

    x, y = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    assert example_items(None) == []
    assert example_items({"a": x, "b": y}) == [("a", x), ("b", y)]
    assert example_items((x, y)) == [(None, x), (None, y)]
    assert example_items([x, y]) == [(None, x), (None, y)]  # a list of arrays is positional
    assert example_items(x) == [(None, x)]
    # Nested lists of numbers or strings are one array written as lists.
    assert example_items([[0.5, 1.0]]) == [(None, [[0.5, 1.0]])]
    assert example_items([["a", "b"]]) == [(None, [["a", "b"]])]
    assert example_items(([0.5, 1.0],)) == [(None, [0.5, 1.0])]


def test_example_inputs_are_named_and_checked_one_way() -> None:
    from ferry.converters._base import name_examples

    x, y = np.zeros(1), np.ones(1)
    assert list(name_examples({"b": y, "a": x}, ["a", "b"])) == ["a", "b"]
    assert name_examples((x, y), ["a", "b"]) == {"a": x, "b": y}
    assert name_examples(x, ["a"]) == {"a": x}
    assert name_examples((x,), ["a", "b"], leading=True) == {"a": x}
    with pytest.raises(
        InvalidInputError, match=r"example_inputs names 'c', which .* does not take"
    ):
        name_examples({"a": x, "c": y}, ["a", "b"])
    with pytest.raises(InvalidInputError, match=r"example_inputs lacks 'b'.*inputs are: a, b"):
        name_examples({"a": x}, ["a", "b"])
    with pytest.raises(InvalidInputError, match=r"lacks 'a'.*positional"):
        name_examples({"b": y}, ["a", "b"], leading=True)
    with pytest.raises(InvalidInputError, match=r"1 example inputs given, but the model takes 2"):
        name_examples((x,), ["a", "b"])
    with pytest.raises(InvalidInputError, match=r"3 example inputs given, but the model takes 2"):
        name_examples((x, y, x), ["a", "b"], leading=True)


@pytest.mark.parametrize("form", ["dict", "tuple", "array"])
def test_onnx_models_are_verified_on_the_example_inputs(form: str) -> None:
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    given = {"dict": {"x": x}, "tuple": (x,), "array": x}[form]
    result = ferry.convert(models.mlp(), example_inputs=given)
    assert result.parity.passed and dict(result.parity.inputs) == {"x": (5, 16)}
    with pytest.raises(InvalidInputError, match=r"example_inputs names 'image'.*inputs are: x"):
        ferry.convert(models.mlp(), example_inputs={"image": x})
