"""``ferry convert`` on the kit's TensorFlow-family models (TFLite, Keras h5, SavedModel), judged
against each model's own runtime.

Each model is converted through the CLI with a kit input as its example (the converter's parity
check then runs on realistic data), and the written file is run with ``ferry.load`` on two kit
inputs and judged at the task (kit.json) against LiteRT (``.tflite``), Keras (``.h5``) or a TF1
session (the SavedModel TensorFlow 2 cannot restore), run by ``tf_references`` independently of
the converters' own references. The stateful wake-word model is also streamed: its state outputs
fed back as inputs, call after call, against one LiteRT interpreter that keeps its variables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import ferry
import kit_models
from ferry.cli.main import cli
from tf_references import (
    LiteRTStream,
    keras_outputs,
    litert_output_quantization,
    litert_outputs,
    saved_model_outputs,
)

TF_IDS = kit_models.ids("tflite", "keras-h5", "tf-savedmodel")
STATE_IN, STATE_OUT = "state:", "state_out:"


@pytest.fixture(scope="module", params=TF_IDS)
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(model id, the ONNX file ``ferry convert`` wrote, its report as JSON)."""
    mid = request.param
    if not kit_models.kit_ready():
        pytest.skip("the real-model kit is not fetched: run scripts/fetch-kit.sh")
    work = tmp_path_factory.mktemp(mid)
    args = ["convert", str(kit_models.path(mid)), "-o", str(work / "model.onnx")]
    for i, (name, value) in enumerate(kit_models.feeds(mid, 0).items()):
        np.save(work / f"input{i}.npy", value)
        args += ["--example-input", f"{name}={work / f'input{i}.npy'}"]
    args += ["--report", str(work / "report.json")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, f"{mid}: {result.output}"
    assert "Traceback" not in result.output
    report = json.loads((work / "report.json").read_text())
    return mid, work / "model.onnx", report


def reference(mid: str, feeds: dict[str, np.ndarray]) -> Any:
    """The source model's outputs from its own runtime."""
    fmt, path = kit_models.entry(mid)["format"], kit_models.path(mid)
    if fmt == "tflite":
        return litert_outputs(path, feeds)
    if fmt == "keras-h5":
        return keras_outputs(path, feeds)
    return saved_model_outputs(path, feeds)


def dequantize(mid: str) -> dict[str, tuple[float, int]] | None:
    if kit_models.entry(mid)["format"] != "tflite":
        return None
    return litert_output_quantization(kit_models.path(mid)) or None


def model_outputs(got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's own outputs, without the state outputs of a stateful model."""
    return {k: v for k, v in got.items() if not k.startswith(STATE_OUT)}


def paired(got: dict[str, np.ndarray], want: Any) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(output, converted, reference): by name when the reference names them so, else in order."""
    if isinstance(want, dict) and set(want) == set(got):
        return [(k, v, want[k]) for k, v in got.items()]
    values = list(want.values()) if isinstance(want, dict) else list(want)
    assert len(values) == len(got)
    return [(k, v, w) for (k, v), w in zip(got.items(), values)]


def test_convert_writes_a_model_that_passed_its_parity_check(converted: Any) -> None:
    mid, out, report = converted
    assert out.is_file() and out.stat().st_size > 0
    parity = report["parity"]
    assert parity["passed"] and parity["skipped"] is None, parity
    fmt = kit_models.entry(mid)["format"]
    assert report["converter"] == ("tflite" if fmt == "tflite" else "tensorflow")
    # The check ran on the kit input, at the kit's shape.
    want = [i["shape"] for i in kit_models.entry(mid)["inputs"]]
    assert list(parity["inputs"].values()) == want


@pytest.mark.parametrize("index", [0, 1])
def test_converted_model_matches_its_runtime(converted: Any, index: int) -> None:
    mid, out, _ = converted
    feeds = kit_models.feeds(mid, index)
    got = model_outputs(ferry.load(out).run(feeds))
    want = reference(mid, feeds)
    for name, value, expected in paired(got, want):
        assert value.shape == expected.shape and value.dtype == expected.dtype, name
    verdicts = kit_models.judged(mid, "convert", got, want, dequantize=dequantize(mid))
    assert verdicts


def test_info_reads_the_converted_model(converted: Any) -> None:
    mid, out, _ = converted
    result = CliRunner().invoke(cli, ["info", str(out), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    entry = kit_models.entry(mid)
    shapes = [i["shape"] for i in entry["inputs"]]
    # Inputs are named as the source names them (a SavedModel's signature keys, TFLite's tensor
    # names); dims the source leaves open are symbolic.
    assert [i["name"] for i in info["inputs"]] == [i["name"] for i in entry["inputs"]]
    for given, want in zip((i["shape"] for i in info["inputs"]), shapes):
        assert [d for d in given if isinstance(d, int)] == [
            w for g, w in zip(given, want) if isinstance(g, int)
        ]
    outputs = [o for o in info["outputs"] if not o["name"].startswith(STATE_OUT)]
    assert len(outputs) == len(entry["outputs"])
    assert info["param_count"] > 0


def test_stateful_model_streams_as_litert_does(tmp_path: Path) -> None:
    """The wake-word model keeps its streaming buffers in resource variables. Converted, each is
    an input ``state:<name>`` (defaulting to its initial value) and an output
    ``state_out:<name>``; fed back call after call, the model follows one LiteRT interpreter
    that keeps its variables, and the state it returns is the value LiteRT assigned."""
    mid = "wakeword_int8"
    if not kit_models.kit_ready():
        pytest.skip("the real-model kit is not fetched: run scripts/fetch-kit.sh")
    path = kit_models.path(mid)
    result = ferry.convert(path, example_inputs=kit_models.feeds(mid, 0))
    assert result.parity.passed, result.parity.summary()
    assert any(STATE_OUT in note for note in result.notes)
    out = result.save(tmp_path / "model.onnx")
    session = ferry.load(out)
    (name,) = (i["name"] for i in kit_models.entry(mid)["inputs"])
    # The state inputs are optional: they default to the variables' initial values.
    assert session.input_names == [name]
    graph_inputs = [v.name for v in result.model.graph.inputs]
    assert graph_inputs[0] == name and all(n.startswith(STATE_IN) for n in graph_inputs[1:])
    stream = LiteRTStream(path)
    state: dict[str, np.ndarray] = {}
    changed = set()
    outputs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = []
    for step in range(12):
        feeds = kit_models.feeds(mid, step % 6)
        got = session.run({**feeds, **state})
        want, variables = stream.step(feeds)
        outputs.append((model_outputs(got), want))
        for key, value in want.items():
            np.testing.assert_allclose(got[key].astype(int), value.astype(int), atol=1, rtol=0)
        new_state = {k[len(STATE_OUT) :]: v for k, v in got.items() if k.startswith(STATE_OUT)}
        assert sorted(new_state) == sorted(variables), step
        for var, value in variables.items():
            assert new_state[var].dtype == value.dtype == np.int8
            # Integer kernels and QDQ in float may round a value one step apart.
            np.testing.assert_allclose(
                new_state[var].astype(int), value.astype(int), atol=1, rtol=0, err_msg=var
            )
            if state and not np.array_equal(value, state[STATE_IN + var]):
                changed.add(var)
        state = {STATE_IN + k: v for k, v in new_state.items()}
    assert changed == set(variables), "some state never changed: the stream proved nothing"
    # The task's verdict over the whole stream, the calls stacked.
    got_all = {k: np.concatenate([g[k] for g, _ in outputs]) for k in outputs[0][0]}
    want_all = {k: np.concatenate([w[k] for _, w in outputs]) for k in outputs[0][1]}
    kit_models.judged(
        mid, "convert (12 streaming calls)", got_all, want_all, dequantize=dequantize(mid)
    )
