"""The adapter conformance kit (``python -m ferry.conformance --backend NAME``) on adapters made
up to get one thing wrong each (``kit_adapters``), and on ONNX Runtime: the kit passes a
conforming adapter and catches a wrong op, an engine error escaping on a bad input, a
thread-unsafe adapter and a wrong answer at another size.
"""

from __future__ import annotations

import json
from pathlib import Path

import kit_adapters
import pytest
from kit_adapters import Aborts, Crashy, Lies, NumpyEngine, Refuses, Unsafe, WrongRelu

from ferry import conformance
from ferry.backends import get_backend
from ferry.conformance import (
    CHECKS,
    check_bad_inputs,
    check_cache,
    check_dynamic,
    check_kit,
    check_threads,
    read_adapter_report,
    run_adapter_kit,
)

#: The node cases the made-up adapters' checks run (theirs, and two they do not claim).
OPS = [("", "Relu"), ("", "Add"), ("", "MatMul"), ("", "Neg")]
#: Every check but the kit's (a test of its own below).
FAST = [c for c in CHECKS if c != "kit"]


@pytest.fixture
def adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    kit_adapters.register(monkeypatch)


def test_a_conforming_adapter_passes_every_check(adapters: None, tmp_path: Path) -> None:
    report = run_adapter_kit(get_backend(NumpyEngine.name), FAST, ops=OPS, workers=0)
    assert report.passed, report.summary()
    assert [c.check for c in report.checks] == FAST
    cache = report.check("cache")
    assert cache is not None and "compiles nothing" in cache.summary
    assert report.nodes is not None and report.nodes.counts()["pass"] >= 3
    md = conformance.write_adapter_report(report, tmp_path, ["--checks", ",".join(FAST)])
    text = md.read_text()
    assert text.startswith("# Adapter conformance: kit-numpy") and "**PASS**" in text
    assert "| Kit models judged at the task | not run |" in text
    assert "| Relu | yes | 1 | 0 | 0 |" in text
    again = read_adapter_report(md.with_suffix(".json"))
    assert again.to_dict() == report.to_dict()


def test_a_wrong_op_is_a_claimed_failure_and_fails_the_cli(adapters: None, tmp_path: Path) -> None:
    report = run_adapter_kit(get_backend(WrongRelu.name), ["node"], ops=OPS, workers=0)
    node = report.check("node")
    assert node is not None and node.status == "fail" and "Relu" in node.summary
    assert not report.passed
    args = ["--backend", WrongRelu.name, "--out", str(tmp_path), "--workers", "0"]
    args += ["--checks", "node,dynamic", "--op", "Relu"]
    assert conformance.main(args) == 1
    data = json.loads((tmp_path / f"{WrongRelu.name}.json").read_text())
    assert data["passed"] is False and data["nodes"]["claimed_failures"] == {"Relu": ["test_relu"]}
    # The same check on the right adapter: exit 0.
    args[1] = NumpyEngine.name
    assert conformance.main(args) == 0


def test_an_engine_error_escaping_on_a_bad_input_is_caught(adapters: None) -> None:
    result = check_bad_inputs(get_backend(Crashy.name))
    assert result.status == "fail"
    assert "the engine's own error escaped" in result.summary and "TypeError" in result.summary
    assert any(
        d.startswith("an unknown input name: refused: InvalidInputError") for d in result.details
    )
    assert result.details[-1] == "a good input afterwards: answered right"
    assert check_bad_inputs(get_backend(NumpyEngine.name)).status == "pass"


def test_a_thread_unsafe_adapter_is_caught(adapters: None) -> None:
    result = check_threads(get_backend(Unsafe.name))
    assert result.status == "fail" and "differ from the serial ones" in result.summary
    assert check_threads(get_backend(NumpyEngine.name)).status == "pass"


def test_dynamic_sizes_claimed_or_refused_never_wrong(adapters: None) -> None:
    lies = check_dynamic(get_backend(Lies.name))
    assert lies.status == "fail" and "a wrong answer" in lies.summary
    refuses = check_dynamic(get_backend(Refuses.name))
    assert refuses.status == "pass", refuses.summary
    assert (
        "does not claim dynamic shapes" in refuses.summary
        and "refused batch 3, 7" in refuses.summary
    )


def test_an_entry_point_plugin_runs_the_kit(acme_npu: str) -> None:
    # The example vendor adapter, found through the 'ferry.backends' entry point as a plugin is.
    report = run_adapter_kit(get_backend(acme_npu), ["cache", "dynamic", "bad-inputs", "threads"])
    assert report.passed, report.summary()
    assert all(c.status == "pass" for c in report.checks), report.summary()


def test_an_adapter_that_crashes_its_process_fails_that_check_only() -> None:
    # Not registered (module:Class, as the command line takes one): workers find it pickled.
    report = run_adapter_kit(Aborts(), ["dynamic", "threads"], workers=1)
    dynamic, threads = report.checks
    assert dynamic.status == "fail", dynamic.summary
    assert dynamic.summary.startswith("the adapter crashed the process (exit code")
    assert threads.status == "pass", threads.summary


def test_the_kit_passes_for_onnxruntime_on_a_sample(tmp_path: Path) -> None:
    ops = [("", "Relu"), ("", "Conv"), ("", "Softmax")]
    report = run_adapter_kit(get_backend("onnxruntime"), FAST, per_op=1, ops=ops, workers=0)
    assert report.passed, report.summary()
    assert report.sampled == "at most 1 node case per op"
    cache = report.check("cache")
    assert cache is not None and cache.summary.startswith("nothing to cache")


def test_cache_check_fails_an_adapter_that_claims_a_cache_but_stores_nothing(
    adapters: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kit_adapters.NumpyPartition, "serialize", lambda self: b"")
    result = check_cache(get_backend(NumpyEngine.name))
    assert result.status == "fail" and "serialize() gives no bytes" in result.summary


def test_kit_check_says_how_to_fetch_an_absent_kit(
    adapters: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FERRY_KIT", str(tmp_path / "no-kit"))
    result = check_kit(get_backend(NumpyEngine.name))
    assert result.status == "skip" and "bash scripts/fetch-kit.sh" in result.summary


def _tiny_kit(root: Path) -> Path:
    """A kit folder in the kit's layout: the probe model as kit model 'probe' (judged by cosine),
    and an entry in another format; kit.json but no inputs.py."""
    import onnx

    from ferry.conformance._probe import probe_model

    (root / "models" / "probe").mkdir(parents=True)
    (root / "models" / ".done").touch()
    onnx.save(probe_model(), root / "models" / "probe" / "probe.onnx")
    entries = [
        {"id": "probe", "file": "probe/probe.onnx", "format": "onnx",
         "judge": {"kind": "cosine", "min": 0.9999}},
        {"id": "nets", "file": "nets", "format": "torch-state-dict",
         "judge": {"kind": "cosine", "min": 0.999}},
    ]  # fmt: skip
    (root / "kit.json").write_text(json.dumps({"models": entries}))
    return root


def test_kit_check_judges_at_the_task_and_names_what_it_could_not_run(
    adapters: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = _tiny_kit(tmp_path / "kit")
    monkeypatch.setenv("FERRY_KIT", str(kit))
    good = check_kit(get_backend(NumpyEngine.name), models=["probe", "nets", "absent"])
    assert good.status == "pass", good.summary
    probe, nets, absent = good.rows
    assert probe["status"] == "pass" and probe["placed"] == "3/3"
    assert probe["agreement"] == "cosine 1.0000 (>= 0.9999)"
    assert probe["inputs"] == "found by ferry (no inputs.py beside kit.json)"
    assert nets["status"] == "skip" and "--kit-file nets=FILE.onnx" in nets["note"]
    assert absent["status"] == "skip" and absent["note"] == "not in the kit's manifest"
    wrong = check_kit(get_backend(WrongRelu.name), models=["probe"])
    assert wrong.status == "fail" and wrong.summary.startswith("1 of 1 kit models fail: probe")


def test_cli_names_what_to_install_for_a_missing_backend(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    status = conformance.main(["--backend", "no-such-engine", "--out", str(tmp_path)])
    assert status == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "unknown backend 'no-such-engine'" in errors[0] and "pip install" in errors[0]
    assert conformance.main(["--backend", "onnxruntime", "--checks", "nope"]) == 2


@pytest.mark.real
@pytest.mark.slow
def test_kit_check_judges_kit_models_at_the_task() -> None:
    from ferry.conformance._check_kit import FETCH_COMMAND, kit_dir

    if not (kit_dir() / "models" / ".done").is_file():
        pytest.skip(f"the real-model kit is not fetched: {FETCH_COMMAND}")
    tools = Path(__file__).resolve().parents[1] / "real" / "kit"
    result = check_kit(get_backend("openvino"), models=["orientation", "mtcnn_torch"], tools=tools)
    assert result.status == "pass", result.summary
    orientation, mtcnn = result.rows
    assert orientation["status"] == "pass" and orientation["placed"] == "115/115"
    assert orientation["agreement"] == "top1 1.0000 (>= 1)"
    assert orientation["inputs"] == "the kit's recipes"
    assert mtcnn["status"] == "skip" and "--kit-file mtcnn_torch=" in mtcnn["note"]
