"""``ferry export --target web``: the bundle's files, manifest, ops check, errors and CLI (no browser).

The export runs the bundle's model in Node through the bundle's own ``ferry.js`` and ``ort/``
files (onnxruntime-web's wasm build, the binary a browser gets) and compares with ONNX Runtime:
a passing export is the Node smoke test. These tests need Node and npm (``npm`` fixture: skip,
or fail in CI).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from ferry.cli.main import cli
from ferry.errors import (
    BackendUnavailableError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)
from ferry.graph import load_model
from ferry.optimizer.quantize import ImagePreprocessing
from ferry.web import (
    BUNDLE_FORMAT,
    PINNED_ORT_WEB_VERSION,
    _npm,
    check_web_ops,
    export_web,
    run_bundle_in_node,
)

pytestmark = pytest.mark.usefixtures("npm")


def _conv_model(opset: int = 17) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc"], ["logits"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5])],
        [w, fc],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    folder = tmp_path_factory.mktemp("web") / "site"
    src = folder.parent / "tiny.onnx"
    onnx.save(_conv_model(), src)
    result = export_web(src, folder)
    return folder, result


def test_bundle_has_every_file(bundle: tuple[Path, object]) -> None:
    folder, result = bundle
    names = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert names == {
        "model.onnx",
        "ferry.js",
        "index.html",
        "manifest.json",
        "ort/ort.min.mjs",
        "ort/ort-wasm-simd-threaded.jsep.mjs",
        "ort/ort-wasm-simd-threaded.jsep.wasm",
    }
    wasm = folder / "ort" / "ort-wasm-simd-threaded.jsep.wasm"
    assert wasm.read_bytes()[:4] == b"\0asm"
    assert set(result.files) == names  # type: ignore[attr-defined]
    # Nothing left beside it: the staging folder was renamed into place.
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []


def test_manifest(bundle: tuple[Path, object]) -> None:
    folder, _ = bundle
    m = json.loads((folder / "manifest.json").read_text())
    assert m["format"] == BUNDLE_FORMAT
    assert m["onnxruntime_web_version"] == PINNED_ORT_WEB_VERSION
    assert m["model"]["file"] == "model.onnx"
    assert m["model"]["sha256"] == m["files"]["model.onnx"]
    assert m["inputs"] == [{"name": "x", "shape": ["batch", 3, 8, 8], "dtype": "float32"}]
    assert m["outputs"] == [{"name": "logits", "shape": ["batch", 5], "dtype": "float32"}]
    assert m["opset"] == {"": 17}
    assert m["preprocessing"] is None
    assert m["ops_check"]["passed"] and m["ops_check"]["nodes"] == 5
    assert m["verification"]["passed"]
    import hashlib

    for name, digest in m["files"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    # The model loads in ONNX Runtime and is the source model (weights inline).
    ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    assert not list(folder.glob("*.data"))


def _references(text: str) -> set[str]:
    """Relative URLs a page or module names: imports, fetches, script sources."""
    found = set(re.findall(r"""(?:from|import)\s*\(?\s*['"](\.{1,2}/[^'"]+)['"]""", text))
    found |= set(re.findall(r"""fetch\(\s*['"]([^'"]+)['"]""", text))
    found |= set(re.findall(r"""new URL\(\s*['"]([^'"]+)['"]""", text))
    return found


def test_page_and_module_reference_only_bundle_files(bundle: tuple[Path, object]) -> None:
    folder, _ = bundle
    js = (folder / "ferry.js").read_text()
    html = (folder / "index.html").read_text()
    assert not re.search(r"__[A-Z_]+__", js + html)  # every placeholder filled
    for text in (js, html):
        assert "http://" not in text and "https://" not in text  # nothing from a CDN
        for ref in _references(text):
            target = (folder / ref).resolve()
            assert target == folder.resolve() / "ort" or target.exists(), ref
    assert "./ort/ort.min.mjs" in js and "new URL('./ort/', import.meta.url)" in js
    assert "import { load } from './ferry.js'" in html
    for element in ("status", "error", "outputs", "latency"):
        assert f'id="{element}"' in html
    for hook in ("window.ferryReady", "window.ferryRun", "window.ferryBench"):
        assert hook in html
    # The ES module loads the runtime files the bundle holds, by these names.
    entry = (folder / "ort" / "ort.min.mjs").read_text()
    assert "ort-wasm-simd-threaded.jsep.mjs" in entry


def test_node_run_matches_onnxruntime(bundle: tuple[Path, object]) -> None:
    folder, _ = bundle
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    got = run_bundle_in_node(folder, {"x": x})
    want = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert got["logits"].shape == (2, 5)
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)


def test_node_run_reports_bad_feeds(bundle: tuple[Path, object]) -> None:
    folder, _ = bundle
    from ferry.errors import ExecutionError

    with pytest.raises(ExecutionError, match="unknown input y"):
        run_bundle_in_node(folder, {"y": np.zeros((1, 3, 8, 8), np.float32)})


def test_reexport_replaces_a_previous_bundle(tmp_path: Path) -> None:
    out = tmp_path / "site"
    export_web(_conv_model(), out, verify=False)
    (out / "model.onnx").write_bytes(b"stale")
    export_web(_conv_model(), out, verify=False)
    onnx.load(str(out / "model.onnx"))


def test_refuses_a_folder_that_is_no_bundle(tmp_path: Path) -> None:
    out = tmp_path / "site"
    out.mkdir()
    (out / "precious.txt").write_text("mine")
    with pytest.raises(InvalidInputError, match="not empty and holds no ferry web bundle"):
        export_web(_conv_model(), out, verify=False)
    assert (out / "precious.txt").read_text() == "mine"
    export_web(_conv_model(), out, force=True, verify=False)
    assert not (out / "precious.txt").exists() and (out / "manifest.json").is_file()


def test_corrupt_model_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf at all")
    with pytest.raises(ModelLoadError):
        export_web(bad, tmp_path / "site")
    with pytest.raises(ModelLoadError, match="not found"):
        export_web(tmp_path / "missing.onnx", tmp_path / "site")
    assert not (tmp_path / "site").exists()


def _unsupported_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="ok_relu"),
        helper.make_node("MaxRoiPool", ["r", "rois"], ["p"], name="roi_pool", pooled_shape=[2, 2]),
        helper.make_node("ImageDecoder", ["bytes"], ["img"], name="decoder"),
    ]
    graph = helper.make_graph(
        nodes,
        "unsupported",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4]),
            helper.make_tensor_value_info("rois", TensorProto.FLOAT, [1, 5]),
            helper.make_tensor_value_info("bytes", TensorProto.UINT8, [100]),
        ],
        [
            helper.make_tensor_value_info("p", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("img", TensorProto.UINT8, None),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def test_ops_check_lists_every_missing_op(tmp_path: Path) -> None:
    check = check_web_ops(load_model(_unsupported_model()))
    assert not check.passed
    assert {(n, o) for n, o, _ in check.unsupported} == {
        ("roi_pool", "MaxRoiPool"),
        ("decoder", "ImageDecoder"),
    }
    with pytest.raises(UnsupportedOpError) as info:
        export_web(_unsupported_model(), tmp_path / "site")
    message = str(info.value)
    assert "roi_pool (MaxRoiPool)" in message and "decoder (ImageDecoder)" in message
    assert sorted(info.value.ops) == [("ImageDecoder", "decoder"), ("MaxRoiPool", "roi_pool")]
    assert not (tmp_path / "site").exists()


def test_ops_check_refuses_an_opset_the_runtime_cannot_load() -> None:
    check = check_web_ops(load_model(_conv_model(opset=27)))
    assert not check.passed and "opset 27" in check.opset_problems[0]


def test_ops_check_old_versions_and_unmeasured_domains() -> None:
    # Add-1 (consumed_inputs) has no kernel; Relu-14 has; a com.microsoft op is unmeasured.
    nodes = [
        helper.make_node("Relu", ["x"], ["y"], name="r"),
        helper.make_node("Gelu", ["y"], ["z"], name="g", domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    check = check_web_ops(load_model(model))
    assert check.passed and check.unmeasured == (("g", "com.microsoft::Gelu"),)
    old = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["x", "x"], ["y"], name="add")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 6)],
    )
    check = check_web_ops(load_model(old))
    assert not check.passed and "opset 7" in check.unsupported[0][2]


def test_ir_version_lowered_to_what_the_runtime_loads(tmp_path: Path) -> None:
    from ferry.web import _ort_web_ops

    model = _conv_model()
    model.ir_version = _ort_web_ops.MAX_IR_VERSION + 1
    result = export_web(model, tmp_path / "site", verify=False)
    assert (
        onnx.load(str(tmp_path / "site" / "model.onnx")).ir_version == _ort_web_ops.MAX_IR_VERSION
    )
    assert result.manifest["model"]["source_ir_version"] == _ort_web_ops.MAX_IR_VERSION + 1


def test_external_data_is_inlined(tmp_path: Path) -> None:
    src = tmp_path / "ext" / "m.onnx"
    src.parent.mkdir()
    onnx.save_model(
        _conv_model(), str(src), save_as_external_data=True, size_threshold=0, location="m.data"
    )
    assert (src.parent / "m.data").is_file()
    export_web(src, tmp_path / "site")
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == [
        "ferry.js",
        "index.html",
        "manifest.json",
        "model.onnx",
        "ort",
    ]


def test_preprocessing_goes_into_the_manifest(tmp_path: Path) -> None:
    pre = ImagePreprocessing(
        size=(8, 8), layout="NCHW", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)
    )
    result = export_web(_conv_model(), tmp_path / "site", preprocessing=pre, verify=False)
    assert result.manifest["preprocessing"] == {
        "size": [8, 8], "layout": "NCHW", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25],
        "scale": 255.0, "channels": 3, "input": "x",
    }  # fmt: skip
    with pytest.raises(InvalidInputError, match="ImagePreprocessing"):
        export_web(_conv_model(), tmp_path / "other", preprocessing={"size": (8, 8)}, verify=False)  # type: ignore[arg-type]


def test_npm_missing_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(BackendUnavailableError, match="apt-get install nodejs npm"):
        export_web(_conv_model(), tmp_path / "site")
    assert not (tmp_path / "site").exists()


def test_npm_install_failure_shows_npm_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "empty-cache"))
    fake = tmp_path / "bin" / "npm"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho 'npm ERR! code E404' >&2\necho 'npm ERR! 404 No match for version' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(fake) if name == "npm" else None)
    with pytest.raises(BackendUnavailableError, match="No match for version") as info:
        _npm.ensure_onnxruntime_web("0.0.0-nonexistent")
    assert "exit 1" in str(info.value)
    assert not list((tmp_path / "empty-cache" / "npm").iterdir())  # no half-filled cache


def test_cli_export_web(tmp_path: Path) -> None:
    src = tmp_path / "tiny.onnx"
    onnx.save(_conv_model(), src)
    out = tmp_path / "site"
    report = tmp_path / "report.json"
    result = CliRunner().invoke(
        cli, ["export", str(src), "--target", "web", "-o", str(out), "--report", str(report)]
    )
    assert result.exit_code == 0, result.output
    assert "ops check ok" in result.output and "parity ok" in result.output
    data = json.loads(report.read_text())
    assert data["written"] and data["format"] == BUNDLE_FORMAT
    assert (out / "index.html").is_file()


def test_cli_errors_exit_2_without_traceback(tmp_path: Path) -> None:
    src = tmp_path / "bad.onnx"
    onnx.save(_unsupported_model(), src)
    result = CliRunner().invoke(
        cli, ["export", str(src), "--target", "web", "-o", str(tmp_path / "site")]
    )
    assert result.exit_code == 2, result.output
    assert (
        "MaxRoiPool" in result.output
        and "ImageDecoder" in result.output
        and "Traceback" not in result.output
    )
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("x")
    good = tmp_path / "tiny.onnx"
    onnx.save(_conv_model(), good)
    result = CliRunner().invoke(cli, ["export", str(good), "--target", "web", "-o", str(busy)])
    assert result.exit_code == 2 and "--force" in result.output
    result = CliRunner().invoke(
        cli, ["export", str(good), "--target", "web", "-o", str(busy), "--precision", "fp16"]
    )
    assert result.exit_code == 2 and "--target tflite" in result.output
    result = CliRunner().invoke(
        cli,
        ["export", str(good), "--target", "tflite", "-o", str(tmp_path / "m.tflite"), "--force"],
    )
    assert result.exit_code == 2 and "--force applies to --target web" in result.output
