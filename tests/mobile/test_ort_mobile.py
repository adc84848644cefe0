"""``export_ort_mobile``: the ORT format model, the reduced-build config, the usability check and
the manifest, as ONNX Runtime's own tools make them, verified, and never a half-written folder.

References here are independent of the code under test where they can be: numpy for what a
model computes, ONNX's op schemas for the ops a config must list, ONNX Runtime's own converter
script and config parser for the formats.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.tools.reduced_build_config_parser import parse_config

import ferry
import models
from ferry.errors import (
    ConversionError,
    ExecutionError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)
from ferry.mobile import _ort_mobile
from ferry.mobile._ort_mobile import export_ort_mobile

RNG = np.random.default_rng(3)


def qdq_conv(*, weight_zero_point: bool = True) -> onnx.ModelProto:
    """x -> Q/DQ -> Conv(DQ(int8 weight)) -> Q/DQ -> y: a static-int8 model ORT fuses into
    QLinearConv (rounding a few outputs to the neighbouring quantization step)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8), "w_q"),
        numpy_helper.from_array(np.array(0.02, np.float32), "w_s"),
        numpy_helper.from_array(np.array(0.05, np.float32), "x_s"),
        numpy_helper.from_array(np.array(128, np.uint8), "x_z"),
        numpy_helper.from_array(np.array(0.1, np.float32), "y_s"),
        numpy_helper.from_array(np.array(128, np.uint8), "y_z"),
    ]
    w_inputs = ["w_q", "w_s"]
    if weight_zero_point:
        inits.append(numpy_helper.from_array(np.array(0, np.int8), "w_z"))
        w_inputs.append("w_z")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", w_inputs, ["wd"]),
        helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "y_s", "y_z"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "y_s", "y_z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def two_inputs_feeds(batch: int = 3) -> dict[str, np.ndarray]:
    return {
        "a": RNG.standard_normal((batch, 4)).astype(np.float32),
        "b": RNG.standard_normal((batch, 4)).astype(np.float32),
        "k": np.array(3, dtype=np.int64),
    }


def op_lines(config: Path) -> list[str]:
    return [
        line
        for line in config.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]


def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------------------------------------
# What is written


def test_writes_the_files_and_a_manifest_that_describes_them(save: Any, tmp_path: Path) -> None:
    out = tmp_path / "mobile"
    result = export_ort_mobile(save(models.two_inputs()), out)

    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "model.ort",
        "required_operators.config",
        "usability.txt",
    ]
    assert {role: p.name for role, p in result.files.items()} == {
        "model": "model.ort",
        "config": "required_operators.config",
        "usability": "usability.txt",
        "manifest": "manifest.json",
    }
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest == json.loads(json.dumps(result.manifest))
    assert manifest["ferry_version"] == ferry.__version__
    assert manifest["onnxruntime_version"] == ort.__version__
    assert manifest["opset_imports"] == {"ai.onnx": models.OPSET}
    assert manifest["source"]["file"] == "model.onnx"
    source_bytes = (tmp_path / "model.onnx").read_bytes()
    assert manifest["source"]["sha256"] == hashlib.sha256(source_bytes).hexdigest()
    # Every file but the manifest itself, with its real size and digest.
    assert set(manifest["files"]) == {"model.ort", "required_operators.config", "usability.txt"}
    for name, entry in manifest["files"].items():
        data = (out / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert manifest["inputs"] == [
        {"name": "a", "shape": ["batch", 4], "dtype": "float32"},
        {"name": "b", "shape": ["batch", 4], "dtype": "float32"},
        {"name": "k", "shape": [], "dtype": "int64"},
    ]
    assert [(o["name"], o["dtype"]) for o in manifest["outputs"]] == [
        ("sum", "float32"),
        ("mask", "bool"),
    ]
    assert manifest["optimization"] == {
        "style": "fixed",
        "level": "all",
        "target_platform": None,
        "disabled_optimizers": ["NchwcTransformer"],
        "type_reduction": False,
    }
    assert manifest["verification"]["passed"] is True
    assert [ep["ep"] for ep in manifest["usability"]["eps"]] == [
        "NNAPI",
        "CoreML NeuralNetwork",
        "CoreML MLProgram",
    ]


def test_ort_file_is_an_ort_format_model_that_computes_the_model(save: Any, tmp_path: Path) -> None:
    result = export_ort_mobile(save(models.two_inputs()), tmp_path / "out")
    data = result.model_path.read_bytes()
    # A flatbuffer with ORT's file identifier; the format version is the one the file holds.
    assert data[4:8] == b"ORTM"
    assert result.manifest["ort_format_version"].isdigit()
    session = ort.InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    feeds = two_inputs_feeds(batch=5)
    got_sum, got_mask = session.run(["sum", "mask"], feeds)
    np.testing.assert_allclose(got_sum, (feeds["a"] + feeds["b"]) * 3, rtol=1e-6)
    np.testing.assert_array_equal(got_mask, feeds["a"] > feeds["b"])


def test_config_lists_exactly_the_ops_with_their_since_versions(save: Any, tmp_path: Path) -> None:
    """With no graph optimization the .ort keeps the model's nodes, so the config must be
    exactly those ops at the versions ONNX's schemas give for opset 17."""
    result = export_ort_mobile(save(models.two_inputs()), tmp_path / "out", level="disable")
    want: dict[int, set[str]] = {}
    for op in ("Add", "Cast", "Mul", "Greater"):
        since = onnx.defs.get_schema(op, models.OPSET, "").since_version
        want.setdefault(since, set()).add(op)
    required, type_filter = parse_config(str(result.files["config"]))
    assert required == {"ai.onnx": want}
    assert type_filter is None
    assert {
        d: {v: set(ops) for v, ops in by.items()} for d, by in result.required_operators.items()
    } == {"ai.onnx": want}


def test_config_descends_into_subgraphs(save: Any, tmp_path: Path) -> None:
    result = export_ort_mobile(save(models.with_if()), tmp_path / "out", level="disable")
    ops = {op for by in result.required_operators.values() for v in by.values() for op in v}
    assert ops == {"ReduceSum", "Greater", "If", "Mul", "Neg"}


def test_type_reduction_lists_the_types_each_op_needs(save: Any, tmp_path: Path) -> None:
    result = export_ort_mobile(
        save(models.two_inputs()), tmp_path / "out", level="disable", type_reduction=True
    )
    config = result.files["config"]
    assert config.name == "required_operators_and_types.config"
    assert result.manifest["optimization"]["type_reduction"] is True
    cast = next(e for line in op_lines(config) for e in _entries(line) if e.startswith("Cast"))
    # Cast reads the int64 input k and writes float: both sides matter to Cast's kernel.
    assert json.loads(cast[len("Cast") :]) == {
        "inputs": {"0": ["int64_t"]},
        "outputs": {"0": ["float"]},
    }
    required, type_filter = parse_config(str(config), enable_type_reduction=True)
    assert type_filter is not None
    assert "Cast" in {op for ops in required["ai.onnx"].values() for op in ops}


def _entries(line: str) -> list[str]:
    """The op entries of a config line; a type JSON may hold commas, so split at top level."""
    body = line.split(";", 2)[2]
    entries, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            entries.append(body[start:i])
            start = i + 1
    return [*entries, body[start:]]


@pytest.mark.parametrize(
    ("builder", "style", "types"),
    [(models.conv, "Fixed", False), (models.with_if, "Fixed", True), (qdq_conv, "Runtime", True)],
)
def test_same_ops_and_types_as_onnxruntimes_own_converter(
    builder: Any, style: str, types: bool, save: Any, tmp_path: Path
) -> None:
    """ORT's convert_onnx_models_to_ort script on the same model writes the same op lines."""
    from onnxruntime.tools.convert_onnx_models_to_ort import (
        OptimizationStyle,
        convert_onnx_models_to_ort,
    )

    source = save(builder())
    theirs = tmp_path / "theirs"
    convert_onnx_models_to_ort(
        source,
        output_dir=theirs,
        optimization_styles=[OptimizationStyle[style]],
        enable_type_reduction=types,
    )
    ours = export_ort_mobile(
        source, tmp_path / "ours", optimization=style.lower(), type_reduction=types
    )
    [their_config] = theirs.glob("*.config")
    assert op_lines(ours.files["config"]) == op_lines(their_config)


# ---------------------------------------------------------------------------------------------
# Verification


def test_verifies_on_given_samples(save: Any, tmp_path: Path) -> None:
    samples = [two_inputs_feeds(batch=2), two_inputs_feeds(batch=7)]
    result = export_ort_mobile(save(models.two_inputs()), tmp_path / "out", samples=samples)
    verification = result.verification
    assert verification is not None and verification.passed
    assert verification.inputs == "given"
    assert [run.input_index for run in verification.runs] == [0, 1]
    assert [dict(run.parity.inputs)["a"] for run in verification.runs] == [(2, 4), (7, 4)]
    assert {o.name for o in verification.runs[0].parity.outputs} == {"sum", "mask"}


def test_a_bad_sample_is_refused_naming_the_input(
    save: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any time goes into converting."""

    def no_conversion(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("converted before checking the samples")

    monkeypatch.setattr(_ort_mobile, "_convert", no_conversion)
    with pytest.raises(InvalidInputError, match="'k'"):
        export_ort_mobile(
            save(models.two_inputs()),
            tmp_path / "out",
            samples={**two_inputs_feeds(), "k": np.array(3.0)},
        )
    with pytest.raises(InvalidInputError, match="unknown input 'z'"):
        export_ort_mobile(
            save(models.two_inputs()), tmp_path / "out", samples={**two_inputs_feeds(), "z": 1}
        )
    assert not (tmp_path / "out").exists()


def test_generated_inputs_say_what_was_guessed(save: Any, tmp_path: Path) -> None:
    path = save(models.reshape_to([3, -1]))
    with pytest.raises(ExecutionError, match=r"guessed sizes .*give samples or shapes"):
        export_ort_mobile(path, tmp_path / "guessed")
    assert not (tmp_path / "guessed").exists()
    result = export_ort_mobile(path, tmp_path / "sized", shapes={"x": (2, 6)})
    assert result.verification is not None and result.verification.passed
    assert dict(result.verification.runs[0].parity.inputs) == {"x": (2, 6)}


def test_a_file_that_computes_something_else_fails_and_leaves_nothing(
    save: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The .ort of another model (other weights) in place of the right one: refused."""
    other = save(models.mlp(seed=1), "other.onnx")
    convert = _ort_mobile._convert

    def wrong(model: Any, source: Path, dest: Path, options: Any, *, runtime_replay: bool) -> None:
        convert(model, other, dest, options, runtime_replay=runtime_replay)

    monkeypatch.setattr(_ort_mobile, "_convert", wrong)
    source = save(models.mlp(seed=0))
    parent = tmp_path / "exports"
    parent.mkdir()
    with pytest.raises(ConversionError, match=r"does not compute what the source does.*'y'"):
        export_ort_mobile(source, parent / "new")
    assert list(parent.iterdir()) == []  # no folder, no staging left behind

    (parent / "empty").mkdir()
    with pytest.raises(ConversionError):
        export_ort_mobile(source, parent / "empty")
    assert list((parent / "empty").iterdir()) == []
    assert sorted(p.name for p in parent.iterdir()) == ["empty"]

    monkeypatch.undo()
    previous = export_ort_mobile(source, parent / "previous")
    before = listing(previous.output_dir)
    monkeypatch.setattr(_ort_mobile, "_convert", wrong)
    with pytest.raises(ConversionError):
        export_ort_mobile(source, parent / "previous", overwrite=True)
    assert listing(previous.output_dir) == before


def test_runtime_style_is_checked_as_loaded_and_with_its_optimizations_replayed(
    save: Any, tmp_path: Path
) -> None:
    result = export_ort_mobile(save(qdq_conv()), tmp_path / "out", optimization="runtime")
    verification = result.verification
    assert verification is not None and verification.passed
    loaded, replayed = verification.runs
    assert "replayed" not in loaded.what and "replayed" in replayed.what
    # Loaded plainly it runs the basic-level graph: float Conv between Q/DQ, as written. With its
    # saved optimizations replayed it runs QLinearConv, which rounds some outputs to the next
    # quantization step (0.1): the file really carries those optimizations.
    assert loaded.drift.max_abs_error == 0
    assert replayed.drift.max_abs_error == pytest.approx(0.1, abs=1e-3)
    assert "0.1" in verification.summary()
    # Its config covers both graphs, so a minimal build runs it either way.
    ops = {op for by in result.required_operators.values() for v in by.values() for op in v}
    assert {"Conv", "QLinearConv", "QuantizeLinear", "DequantizeLinear"} <= ops
    assert result.manifest["optimization"]["style"] == "runtime"


def test_rounding_of_onnxruntimes_own_fusions_is_reported_not_failed(
    save: Any, tmp_path: Path
) -> None:
    """The fixed-style file runs QLinearConv where the source has float Conv between Q/DQ; ONNX
    Runtime does the same with the .onnx, so the check passes against that, and the step it
    moved from the model as written (one quantization step, 0.1) is reported."""
    result = export_ort_mobile(save(qdq_conv()), tmp_path / "out")
    verification = result.verification
    assert verification is not None and verification.passed
    assert verification.max_abs_error == 0
    assert verification.max_drift == pytest.approx(0.1, abs=1e-3)
    assert not verification.runs[0].drift.passed
    assert "more than ferry's tolerance" in verification.summary()
    assert result.manifest["verification"]["max_drift"] == pytest.approx(0.1, abs=1e-3)


def test_verify_false_skips_the_check(save: Any, tmp_path: Path) -> None:
    result = export_ort_mobile(save(models.mlp()), tmp_path / "out", verify=False)
    assert result.verification is None
    assert result.manifest["verification"] is None
    assert "not verified" in "\n".join(result.lines())


def test_target_platform_amd64_keeps_the_nchwc_transformer(save: Any, tmp_path: Path) -> None:
    result = export_ort_mobile(save(models.conv()), tmp_path / "out", target_platform="amd64")
    assert result.manifest["optimization"]["disabled_optimizers"] == []
    assert result.verification is not None and result.verification.passed


# ---------------------------------------------------------------------------------------------
# Mobile usability


def test_usability_is_onnxruntimes_analysis_as_data(save: Any, tmp_path: Path) -> None:
    fixed = export_ort_mobile(save(models.mlp(batch=1), "fixed.onnx"), tmp_path / "fixed")
    assert [(ep.ep, ep.suitability) for ep in fixed.usability.eps] == [
        ("NNAPI", "YES"),
        ("CoreML NeuralNetwork", "YES"),
        ("CoreML MLProgram", "YES"),
    ]
    assert fixed.usability.dynamic_inputs == ()
    assert fixed.usability.eps[0].supported_nodes == fixed.usability.eps[0].nodes == 4

    dynamic = export_ort_mobile(save(models.mlp(), "dynamic.onnx"), tmp_path / "dynamic")
    nnapi = dynamic.usability.eps[0]
    assert dynamic.usability.dynamic_inputs == ("x",)
    assert (nnapi.suitability, nnapi.with_fixed_shapes) == ("NO", "YES")
    assert nnapi.dynamic_shape_nodes == 4
    assert "--fix-shapes" in dynamic.usability.summary()
    text = (tmp_path / "dynamic" / "usability.txt").read_text(encoding="utf-8")
    assert dynamic.usability.summary() in text
    assert "Input is not a fixed size tensor" in text
    assert "Checking NNAPI" in text


def test_a_custom_op_is_named_by_the_usability_check(save: Any, tmp_path: Path) -> None:
    """An op NNAPI lacks (HardSigmoid) appears in the data, not only in the text."""
    graph = helper.make_graph(
        [helper.make_node("HardSigmoid", ["x"], ["y"])],
        "hs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = export_ort_mobile(save(model), tmp_path / "out")
    nnapi = result.usability.eps[0]
    assert nnapi.unsupported_ops == ("ai.onnx:HardSigmoid",)
    assert nnapi.suitability == "NO"


def test_nothing_reaches_the_terminal_or_the_root_logger(save: Any, tmp_path: Path) -> None:
    """ORT's tools print, log through a basicConfig'd root logger and write ORT's C++ log to
    stderr; a fresh process shows none of it leaks."""
    source = save(models.mlp())
    code = textwrap.dedent(
        f"""
        import logging
        from ferry.mobile._ort_mobile import export_ort_mobile
        export_ort_mobile({str(source)!r}, {str(tmp_path / "out")!r}, optimization="runtime",
                          type_reduction=True)
        assert logging.getLogger().handlers == [], logging.getLogger().handlers
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr == ""
    assert (tmp_path / "out" / "model.ort").is_file()


def test_the_analysis_stays_out_of_the_applications_log(
    save: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An app logging at DEBUG gets ferry's own records, not the checker's report line by line."""
    caplog.set_level("DEBUG")
    result = export_ort_mobile(save(models.mlp()), tmp_path / "out")
    assert "Checking NNAPI" in result.usability.text
    assert not [r for r in caplog.records if "NNAPI" in r.getMessage()]


# ---------------------------------------------------------------------------------------------
# Inputs and the output folder


def test_the_input_file_and_its_external_data_are_never_touched(tmp_path: Path) -> None:
    source = models.save_external(models.mlp(), tmp_path / "ext.onnx")
    data = tmp_path / "ext.onnx.data"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (source, data)}
    result = export_ort_mobile(source, tmp_path / "out")
    assert result.verification is not None and result.verification.passed
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (source, data)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext.onnx", "ext.onnx.data", "out"]


@pytest.mark.parametrize("kind", ["ir", "proto"])
def test_in_memory_models(kind: str, tmp_path: Path) -> None:
    proto = models.two_inputs()
    model = ir.from_proto(proto) if kind == "ir" else proto
    result = export_ort_mobile(model, tmp_path / "out", samples=two_inputs_feeds())
    assert result.manifest["source"]["file"] is None
    assert result.verification is not None and result.verification.passed


def test_an_artifact_folder_exports_its_model(tmp_path: Path) -> None:
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    onnx.save(models.mlp(), artifact / "model.onnx")
    result = export_ort_mobile(artifact, tmp_path / "out")
    assert result.manifest["source"]["file"] == "model.onnx"


def test_a_non_empty_folder_needs_overwrite(save: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(InvalidInputError, match="not empty.*overwrite=True"):
        export_ort_mobile(save(models.mlp()), out)
    assert listing(out) == {"notes.txt": b"mine"}


def test_overwrite_replaces_a_previous_export_and_keeps_other_files(
    save: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    export_ort_mobile(save(models.mlp()), out, type_reduction=True)
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    result = export_ort_mobile(save(models.two_inputs()), out, overwrite=True)
    # The typed config of the first export is gone (the new manifest does not list it).
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "model.ort",
        "notes.txt",
        "required_operators.config",
        "usability.txt",
    ]
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert [i["name"] for i in manifest["inputs"]] == ["a", "b", "k"]
    assert (
        manifest["files"]["model.ort"]["sha256"]
        == hashlib.sha256(result.model_path.read_bytes()).hexdigest()
    )


def test_output_folder_is_readable_like_a_made_folder(save: Any, tmp_path: Path) -> None:
    result = export_ort_mobile(save(models.mlp()), tmp_path / "a" / "b" / "out")
    probe = tmp_path / "probe"
    probe.mkdir()
    assert result.output_dir.stat().st_mode & 0o777 == probe.stat().st_mode & 0o777


def test_output_that_is_a_file_is_refused(save: Any, tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("x", encoding="utf-8")
    with pytest.raises(InvalidInputError, match="is a file"):
        export_ort_mobile(save(models.mlp()), tmp_path / "taken")


def test_the_export_never_writes_over_its_own_input(tmp_path: Path) -> None:
    source = tmp_path / "model.ort"  # an ONNX file with the name the export writes
    onnx.save(models.mlp(), source)
    with pytest.raises(InvalidInputError, match="would be overwritten"):
        export_ort_mobile(source, tmp_path, overwrite=True)
    assert onnx.load(str(source)).graph.name == "mlp"


@pytest.mark.parametrize(
    ("option", "value"),
    [("optimization", "fast"), ("level", "max"), ("target_platform", "x86")],
)
def test_unknown_options_list_the_known_ones(
    option: str, value: str, save: Any, tmp_path: Path
) -> None:
    known = {
        "optimization": "fixed, runtime",
        "level": "disable, basic, extended, layout, all",
        "target_platform": "arm, amd64",
    }[option]
    kwargs: dict[str, Any] = {option: value}
    with pytest.raises(InvalidInputError, match=f"unknown {option} '{value}'.*{known}"):
        export_ort_mobile(save(models.mlp()), tmp_path / "out", **kwargs)


# ---------------------------------------------------------------------------------------------
# Errors from ONNX Runtime


def test_ops_onnxruntime_lacks_are_all_named(save: Any, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedOpError, match="acme::FancyAct") as caught:
        export_ort_mobile(save(models.custom_ops()), tmp_path / "out")
    assert caught.value.ops == [
        ("acme::FancyAct", "fancy1"),
        ("acme::FancyAct", "fancy2"),
        ("Rellu", "typo"),
    ]
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_a_model(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="bad.onnx"):
        export_ort_mobile(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_failed_conversion_says_what_to_change(
    save: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ORT loads the model but the conversion itself fails: a ConversionError in ORT's words,
    with the style to try; never a ModelLoadError, since the model loads."""
    options = _ort_mobile._graph_options

    def refusing(*args: Any, **kwargs: Any) -> Any:
        so = options(*args, **kwargs)
        so.add_session_config_entry("optimization.minimal_build_optimizations", "bogus")
        return so

    monkeypatch.setattr(_ort_mobile, "_graph_options", refusing)
    with pytest.raises(ConversionError, match=r"fails to convert.*fixed optimization style"):
        export_ort_mobile(save(models.mlp()), tmp_path / "out", optimization="runtime")
    assert not (tmp_path / "out").exists()


def test_lines_say_what_was_written(save: Any, tmp_path: Path) -> None:
    result = export_ort_mobile(save(models.mlp()), tmp_path / "out", type_reduction=True)
    text = "\n".join(result.lines())
    assert f"wrote {tmp_path / 'out'}" in text
    for name in ("model.ort", "required_operators_and_types.config", "usability.txt"):
        assert name in text
    assert "with types" in text
    assert "verified in onnxruntime" in text
    assert result.usability.summary() in text
