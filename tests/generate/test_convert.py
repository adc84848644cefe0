"""convert_decoder and ``ferry convert`` / ``ferry info`` on decoders: a tiny llama written as a
GGUF (Q4_0 blocks, float, K-quant) and as a Hugging Face folder (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner, Result

import ferry
from ferry.cli.main import cli
from ferry.errors import InvalidInputError, ModelLoadError
from ferry.generate._convert import convert_decoder, decoder_source_kind
from ferry.generate._loop import DecoderSession
from gguf_files import gguf_tensors_from_hf, tiny_llama, write_gguf, write_hf_folder

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vocabulary(size: int) -> list[str]:
    """Three ChatML control tokens, then single printable characters (byte-level spellings)."""
    chars = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    return ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "Ġ", *chars][:size]


def tiny_gguf(
    path: Path, *, matrix_type: str | None = "Q4_0", arch: str = "llama"
) -> tuple[Path, dict[str, Any], dict[str, np.ndarray]]:
    """The tiny llama as llama.cpp's converter writes it (q/k permuted), its projections stored
    as ``matrix_type`` (None: F32), with a byte-level vocabulary and a ChatML template."""
    config, tensors = tiny_llama()
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    out: dict[str, Any] = gguf_tensors_from_hf(config, tensors, matrix_type)
    tokens = vocabulary(config["vocab_size"])
    metadata: dict[str, Any] = {
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.context_length": config["max_position_embeddings"],
        f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv,
        f"{arch}.rope.freq_base": float(config["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.chat_template": TEMPLATE,
    }
    return write_gguf(path, arch, out, metadata), config, tensors


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Any]:
    path, config, tensors = tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q4_0.gguf")
    return path, config, tensors


def prompt_logits(folder: Path, ids: list[int]) -> np.ndarray:
    """The artifact's logits for ``ids`` in one pass (no cache)."""
    config = json.loads((folder / "ferry.json").read_text())["generative"]
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.array([ids], dtype=np.int64)
    empty = np.zeros((1, config["num_kv_heads"], 0, config["head_dim"]), np.float32)
    feeds = {
        "input_ids": x,
        "attention_mask": np.ones_like(x),
        "position_ids": np.arange(len(ids))[None],
    }
    for i in range(config["num_layers"]):
        feeds[f"past_key_values.{i}.key"] = feeds[f"past_key_values.{i}.value"] = empty
    return np.asarray(session.run(["logits"], feeds)[0][0])


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="ferry")


def test_gguf_default_keeps_q4_0_blocks_as_stored(source: Any, tmp_path: Path) -> None:
    path, _, _ = source
    folder = convert_decoder(path, tmp_path / "out")
    section = json.loads((folder / "ferry.json").read_text())["generative"]
    assert section["precision"] == "int4"
    assert section["accuracy_level"] == 0
    # 2 layers x 7 projections as stored; the F32 embedding, as output head, rounded per block
    assert section["weights"] == {"int4 (Q4_0 as stored)": 14, "int4 (rounded from F32)": 1}
    assert list(section["requantization"]) == ["lm_head"]
    assert section["verified"].startswith("runs: finite logits [1, 9, 80]")
    for name in ("model.onnx", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (folder / name).is_file()
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2] and generation["max_length"] == 512
    decoder = ferry.load(folder)
    assert isinstance(decoder, DecoderSession)
    out = decoder.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=5)
    assert out.prompt_tokens > 5 and 1 <= len(out.ids) <= 5


def test_fp32_from_gguf_and_from_the_hf_folder_agree(source: Any, tmp_path: Path) -> None:
    """The same float weights through both sources (GGUF q/k permuted for adjacent-pair RoPE,
    the checkpoint rotating halves) give the same logits."""
    _, config, tensors = source
    gguf_path, _, _ = tiny_gguf(tmp_path / "f32.gguf", matrix_type=None)
    from_gguf = convert_decoder(gguf_path, tmp_path / "a")
    assert json.loads((from_gguf / "ferry.json").read_text())["generative"]["precision"] == "fp32"
    hf = write_hf_folder(tmp_path / "hf", config, tensors)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).write_bytes((from_gguf / name).read_bytes())
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert decoder_source_kind(hf) == "hf" and decoder_source_kind(gguf_path) == "gguf"
    from_hf = convert_decoder(hf, tmp_path / "b")
    ids = [1, 10, 20, 30, 40, 2, 5]
    a, b = prompt_logits(from_gguf, ids), prompt_logits(from_hf, ids)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    generation = json.loads((from_hf / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]
    result = run("convert", str(hf), "-o", str(tmp_path / "c"), "--no-verify")
    assert result.exit_code == 0, result.output
    assert "architecture: llama   layers: 2" in result.output and "precision: fp32" in result.output
    assert json.loads((from_hf / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE


def test_int8_and_unknown_precisions(source: Any, tmp_path: Path) -> None:
    path, _, _ = source
    folder = convert_decoder(path, tmp_path / "int8", precision="int8", verify=False)
    section = json.loads((folder / "ferry.json").read_text())["generative"]
    # Q4_0 blocks are kept as stored (4-bit) even at int8: never a second rounding
    assert section["weights"]["int4 (Q4_0 as stored)"] == 14
    assert section["weights"]["int8 (rounded from F32)"] == 1
    with pytest.raises(InvalidInputError, match="precision 'int3' is not one of"):
        convert_decoder(path, tmp_path / "x", precision="int3")


def test_half_precision_says_what_was_rounded(source: Any, tmp_path: Path) -> None:
    path, _, _ = source
    folder = convert_decoder(path, tmp_path / "fp16", precision="fp16", verify=False)
    section = json.loads((folder / "ferry.json").read_text())["generative"]
    assert section["weights"] == {"fp16 (rounded from Q4_0)": 14, "fp16 (rounded from F32)": 1}
    result = run("convert", str(path), "-o", str(tmp_path / "bf16"), "--precision", "bf16")
    assert result.exit_code == 0, result.output
    assert "bf16 (rounded from Q4_0)" in result.output
    with pytest.raises(InvalidInputError, match="flavour"):
        convert_decoder(path, tmp_path / "x", flavour="trt")
    with pytest.raises(ModelLoadError, match="no such"):
        convert_decoder(tmp_path / "missing.gguf", tmp_path / "x")


def test_cli_convert_and_info(source: Any, tmp_path: Path) -> None:
    path, _, _ = source
    out = tmp_path / "tiny"
    result = run("convert", str(path), "-o", str(out), "--precision", "int4")
    assert result.exit_code == 0, result.output
    for said in (
        "architecture: llama   layers: 2",
        "precision: int4",
        "14 int4 (Q4_0 as stored)",
        "context: 512   vocab: 80",
        "checked: runs",
        "model.onnx.data",
    ):
        assert said in result.output
    info = run("info", str(out))
    assert info.exit_code == 0, info.output
    assert "chat template (4 lines)" in info.output and "<|im_start|>" in info.output
    assert "special tokens: bos '<|im_start|>', eos '<|im_end|>'" in info.output
    data = json.loads(run("info", str(out), "--json").output)
    _, _, tensors = source
    assert data["kind"] == "artifact" and data["precision"] == "int4"
    assert data["parameters"] == sum(t.size for t in tensors.values())
    assert data["chat_template"] == TEMPLATE
    gguf_info = json.loads(run("info", str(path), "--json").output)
    assert gguf_info["kind"] == "gguf"
    assert gguf_info["quantization"] == {"F32": 6, "Q4_0": 14}
    assert gguf_info["special_tokens"] == {
        "bos": "<|im_start|>",
        "eos": "<|im_end|>",
        "pad": "<|im_end|>",
    }
    text = run("info", str(path))
    assert text.exit_code == 0 and "14 Q4_0, 6 F32" in text.output
    generated = run("generate", str(out), "--prompt", "hi", "--max-new-tokens", "3")
    assert generated.exit_code == 0, generated.output


def one_error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_cli_errors(source: Any, tmp_path: Path) -> None:
    path, _, _ = source
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(path.read_bytes()[:200])
    assert "truncated or corrupt" in one_error_line(run("convert", str(truncated), "-o", "x"))
    wrong = tmp_path / "wrong.gguf"
    wrong.write_bytes(b"NOPE" + bytes(64))
    assert "not a GGUF file" in one_error_line(run("convert", str(wrong), "-o", "x"))
    mamba, _, _ = tiny_gguf(tmp_path / "mamba.gguf", arch="mamba")
    said = one_error_line(run("convert", str(mamba), "-o", str(tmp_path / "m")))
    assert "mamba" in said and "llama" in said
    said = one_error_line(run("convert", str(path), "-o", "x", "--opset", "17"))
    assert "--opset" in said
    assert "truncated or corrupt" in one_error_line(run("info", str(truncated)))
    assert not (tmp_path / "m").exists()


def test_cli_flavour_and_accuracy_level(source: Any, tmp_path: Path) -> None:
    path, _, _ = source
    out = tmp_path / "std"
    args = ["--flavour", "standard", "--accuracy-level", "4", "--no-verify"]
    result = run("convert", str(path), "-o", str(out), *args)
    assert result.exit_code == 0, result.output
    section = json.loads((out / "ferry.json").read_text())["generative"]
    assert section["flavour"] == "standard" and section["accuracy_level"] == 4
    assert "verified" not in section
    onnx_file = tmp_path / "plain.onnx"
    onnx_file.write_bytes(b"not a model")
    said = one_error_line(run("convert", str(onnx_file), "-o", "y.onnx", "--precision", "int4"))
    assert "apply to decoders" in said


def tree_digest(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or the file itself) by its SHA-256."""
    import hashlib

    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def check_failure_sources(kind: str, tmp_path: Path, gguf: Path) -> Path:
    """A source of each kind: the module's GGUF, the same llama as a Hugging Face folder, and
    ferry's graph of it laid out as an optimum and a GenAI folder."""
    import onnx_ir as ir
    from test_onnx_source import genai_folder, optimum_folder

    from ferry.generate._config import DecoderConfig
    from ferry.generate._graph import build_decoder
    from ferry.generate._weights import DecoderWeights

    if kind == "gguf":
        return gguf
    config, tensors = tiny_llama()
    if kind == "hf":
        folder = write_hf_folder(tmp_path / "hf", config, tensors)
        from test_onnx_source import write_tokenizer

        write_tokenizer(folder)
        return folder
    decoder = DecoderConfig.from_hf(config)
    model = build_decoder(decoder, DecoderWeights.from_hf(tensors, decoder), precision="fp32")
    model.metadata_props.clear()
    layout = optimum_folder if kind == "onnx-optimum" else genai_folder
    folder: Path = layout(tmp_path / kind, model)
    assert isinstance(model, ir.Model) and decoder_source_kind(folder) == kind
    return folder


@pytest.mark.parametrize("kind", ["gguf", "hf", "onnx-optimum", "onnx-genai"])
def test_a_failed_check_publishes_nothing_and_leaves_the_source(
    kind: str, source: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pre-write check sees NaN logits (onnxruntime patched to give them): the conversion
    fails with one clear error, nothing appears at the output, an earlier output is kept as it
    was, no staging folder is left, and the source's files are byte for byte as before."""
    from ferry.errors import ConversionError

    gguf, _, _ = source
    src = check_failure_sources(kind, tmp_path / "src", gguf)
    real = ort.InferenceSession

    class NaNLogits:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._session = real(*args, **kwargs)

        def get_outputs(self) -> Any:
            return self._session.get_outputs()

        def run(self, names: Any, feeds: Any, *rest: Any) -> list[np.ndarray]:
            outputs = self._session.run(names, feeds, *rest)
            order = [o.name for o in self._session.get_outputs()]
            return [np.full_like(o, np.nan) if n == "logits" else o for n, o in zip(order, outputs)]

    before = tree_digest(src)
    out_parent = tmp_path / "outs"
    out_parent.mkdir()
    kept = out_parent / "kept"
    kept.mkdir()
    (kept / "old.txt").write_text("the earlier artifact")
    monkeypatch.setattr(ort, "InferenceSession", NaNLogits)
    for out in (out_parent / "new", kept):
        with pytest.raises(ConversionError, match="non-finite values"):
            convert_decoder(src, out)
    assert sorted(p.name for p in out_parent.iterdir()) == ["kept"]
    assert [p.name for p in kept.iterdir()] == ["old.txt"]
    assert (kept / "old.txt").read_text() == "the earlier artifact"
    assert tree_digest(src) == before
    said = one_error_line(run("convert", str(src), "-o", str(out_parent / "cli")))
    assert "non-finite values" in said and not (out_parent / "cli").exists()
    monkeypatch.undo()
    assert convert_decoder(src, out_parent / "ok", verify=True).is_dir()
    assert tree_digest(src) == before
