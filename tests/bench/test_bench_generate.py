"""``ferry bench --generate`` on a tiny random decoder artifact built here (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner, Result
from tests.generate.test_graph_decoder import make_config, make_weights
from tests.generate.test_loop import VOCAB, byte_tokenizer, tiny_decoder

from ferry.bench import GENERATE_SCHEMA, GenerateSpec, check_generate_results, run_generate_bench
from ferry.bench._generate import COLUMNS, custom_domains, prompt_ids
from ferry.cli.main import cli
from ferry.errors import InvalidInputError
from ferry.generate._artifact import generation_config_for, write_decoder_artifact
from ferry.generate._graph import build_decoder

pytest.importorskip("tokenizers")

PROMPT, NEW = 6, 4


def _artifact(folder: Path, precision: str) -> Path:
    config = make_config(vocab_size=VOCAB, context_length=32, eos_ids=(VOCAB - 1,))
    flavour = "standard" if precision == "fp32" else "ort"
    model = build_decoder(config, make_weights(config), precision=precision, flavour=flavour)
    return write_decoder_artifact(
        folder,
        model=model,
        config=config,
        tokenizer=byte_tokenizer(),
        template=None,
        generation_config=generation_config_for(config),
        precision=precision,
    )


@pytest.fixture(scope="module")
def fp32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _artifact(tmp_path_factory.mktemp("gen") / "fp32", "fp32")


@pytest.fixture(scope="module")
def int4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _artifact(tmp_path_factory.mktemp("gen") / "int4", "int4")


def bench(*args: str) -> Result:
    return CliRunner().invoke(cli, ["bench", *args], prog_name="ferry")


def small(folder: Path, *more: str) -> Result:
    return bench(
        str(folder),
        "--generate",
        "--prompt-tokens",
        str(PROMPT),
        "--new-tokens",
        str(NEW),
        "-n",
        "2",
        "--threads",
        "1",
        *more,
    )


def test_table_json_and_report(fp32: Path, tmp_path: Path) -> None:
    out = tmp_path / "gen.json"
    result = small(fp32, "--json", str(out), "--save-report")
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "configuration" in line)
    assert all(column in header for column in COLUMNS), header
    assert "eos ignored" in result.stdout and "onnxruntime fp32" in result.stdout
    data = json.loads(out.read_text())
    check_generate_results(data)
    assert data["schema"] == GENERATE_SCHEMA and data["settings"]["new_tokens"] == NEW
    (row,) = data["configurations"]
    assert row["error"] is None and row["skipped"] is None, row
    # Exactly the counts asked for, eos or not.
    assert (row["prompt_tokens"], row["new_tokens"]) == (PROMPT, NEW)
    for key in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"):
        figure = row[key]
        assert len(figure["runs"]) == 2 and figure["min"] <= figure["median"] <= figure["max"]
        assert figure["min"] > 0
    assert row["peak_rss_mb"] > row["rss_before_load_mb"] > 0 and row["load_s"] > 0
    saved = json.loads((fp32 / "ferry.json").read_text())
    assert "generative" in saved  # the rest of ferry.json is kept
    assert [r["schema"] for r in saved["benchmarks"]] == [GENERATE_SCHEMA]


def test_int4_contrib_ops_are_tried_on_openvino_not_assumed(int4: Path, tmp_path: Path) -> None:
    """OpenVINO reads MatMulNBits and GroupQueryAttention: it is measured, not skipped by the
    ops' domain; an engine that takes only part of the graph is named, not timed."""
    pytest.importorskip("openvino")
    assert "com.microsoft" in custom_domains(int4 / "model.onnx")
    out = tmp_path / "bench.json"
    args = ("--backends", "onnxruntime,openvino", "--precision", "fp32", "--no-isolate")
    result = small(int4, *args, "--json", str(out))
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads(out.read_text())["configurations"]}
    assert rows["openvino fp32"]["error"] is None, rows
    assert rows["openvino fp32"]["decode_tokens_per_s"]["median"] > 0


def test_an_engine_that_takes_part_of_the_graph_is_named(int4: Path) -> None:
    pytest.importorskip("ai_edge_litert")
    result = small(int4, "--backends", "litert", "--precision", "fp32", "--no-isolate")
    assert result.exit_code == 0, result.output
    assert "litert does not run the whole decoder (placed on" in " ".join(result.stdout.split())


def test_openvino_runs_the_standard_fp32_graph(fp32: Path) -> None:
    pytest.importorskip("openvino")
    spec = GenerateSpec(
        backends=("openvino",),
        precisions=("fp32",),
        threads=1,
        prompt_tokens=PROMPT,
        new_tokens=NEW,
        repeats=1,
        isolate=False,
    )
    data = run_generate_bench(fp32, spec)
    rows = {r["label"]: r for r in data["configurations"]}
    assert set(rows) == {"onnxruntime fp32", "openvino fp32"}
    assert rows["openvino fp32"]["skipped"] is None and rows["openvino fp32"]["error"] is None
    assert rows["openvino fp32"]["new_tokens"] == NEW
    # In one process, no configuration's own peak RSS.
    assert rows["openvino fp32"]["peak_rss_mb"] is None


def test_a_plain_model_is_one_error(tmp_path: Path) -> None:
    model = tiny_decoder()
    del model.metadata_props[:]
    onnx.save(model, tmp_path / "model.onnx")
    result = bench(str(tmp_path), "--generate")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not one: bench it without --generate" in lines[0], lines


def test_options_it_does_not_take_and_a_prompt_over_the_context(fp32: Path) -> None:
    result = bench(str(fp32), "--generate", "--batch", "2")
    assert result.exit_code == 2 and "--generate does not take --batch" in result.stderr
    data = run_generate_bench(
        fp32, GenerateSpec(prompt_tokens=30, new_tokens=8, repeats=1, isolate=False)
    )
    assert "exceed the model's context of 32 tokens" in data["configurations"][0]["error"]
    with pytest.raises(InvalidInputError, match="not auto"):
        GenerateSpec(backends=("auto",))


def test_prompt_is_exact_and_deterministic() -> None:
    tok = byte_tokenizer()
    ids = prompt_ids(tok, 1000)
    assert len(ids) == 1000 and ids == prompt_ids(tok, 1000) and ids[:5] == list(b"Alice")
