"""An existing ONNX decoder with past key/values as a convert source: ferry's own tiny llama
graph laid out as an optimum export (plain, merged with ``use_cache_branch``) and as an ONNX
Runtime GenAI folder (other I/O names, positions computed inside the graph) (issue 29)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from click.testing import CliRunner, Result
from test_convert import TEMPLATE, vocabulary

import ferry
from ferry.cli.main import cli
from ferry.errors import InvalidInputError, ModelLoadError
from ferry.generate._config import DecoderConfig
from ferry.generate._convert import convert_decoder, decoder_source_kind
from ferry.generate._graph import build_decoder
from ferry.generate._loop import DecoderSession
from ferry.generate._tokenizer import build_tokenizer
from ferry.generate._weights import DecoderWeights
from ferry.graph import save_model
from gguf_files import tiny_llama

GENAI_NAMES = {
    "past_key_names": "past_key.%d",
    "past_value_names": "past_value.%d",
    "present_key_names": "present_key.%d",
    "present_value_names": "present_value.%d",
}
PROMPT = [1, 10, 20, 30, 40, 5]
FORCED = 7  # the token a merged model's branch run on the wrong side forces


@pytest.fixture(scope="module")
def graph_bytes() -> bytes:
    """The tiny llama as ferry builds it (fp32, onnxruntime flavour), without ferry's metadata:
    a decoder exported by someone else."""
    config_json, tensors = tiny_llama()
    config = DecoderConfig.from_hf(config_json)
    model = build_decoder(config, DecoderWeights.from_hf(tensors, config), precision="fp32")
    model.metadata_props.clear()
    return ir.serde.serialize_model(model).SerializeToString()


def fresh(graph_bytes: bytes) -> ir.Model:
    return ir.serde.deserialize_model(onnx.load_from_string(graph_bytes))


def write_tokenizer(folder: Path, *, template: bool = True) -> None:
    tokens = vocabulary(80)
    tokenizer = build_tokenizer(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
            "tokenizer.ggml.merges": [],
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
        }
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config: dict[str, Any] = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    if template:
        config["chat_template"] = TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def optimum_folder(
    folder: Path, model: ir.Model, *, name: str = "model.onnx", external: bool = True
) -> Path:
    """An optimum export: the graph, config.json, generation_config.json, the tokenizer."""
    folder.mkdir(parents=True)
    save_model(model, folder / name, external_data=external)
    config_json, _ = tiny_llama()
    (folder / "config.json").write_text(json.dumps(config_json))
    # max_length 20 is transformers' generation default, not the context: not taken as such
    generation = {"bos_token_id": 1, "eos_token_id": [2, 0], "max_length": 20}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    write_tokenizer(folder)
    return folder


def genai_folder(folder: Path, model: ir.Model) -> Path:
    """A GenAI folder: the graph's past/present and logits renamed after genai_config.json's
    templates, position_ids computed inside the graph from the attention mask."""
    positions_from_mask(model)
    renames = {"logits": "lm_logits"}
    for i in range(2):
        for kind in ("key", "value"):
            renames[f"past_key_values.{i}.{kind}"] = f"past_{kind}.{i}"
            renames[f"present.{i}.{kind}"] = f"present_{kind}.{i}"
    for value in [*model.graph.inputs, *model.graph.outputs]:
        value.name = renames.get(value.name, value.name)
    folder.mkdir(parents=True)
    save_model(model, folder / "decoder.onnx", external_data=True)
    genai = {
        "model": {
            "bos_token_id": 1,
            "context_length": 128,
            "eos_token_id": [2],
            "pad_token_id": 2,
            "type": "llama",
            "vocab_size": 80,
            "decoder": {
                "filename": "decoder.onnx",
                "head_size": 16,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "num_key_value_heads": 2,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": GENAI_NAMES["past_key_names"],
                    "past_value_names": GENAI_NAMES["past_value_names"],
                },
                "outputs": {
                    "logits": "lm_logits",
                    "present_key_names": GENAI_NAMES["present_key_names"],
                    "present_value_names": GENAI_NAMES["present_value_names"],
                },
            },
        },
        "search": {"max_length": 64, "do_sample": False},
    }
    (folder / "genai_config.json").write_text(json.dumps(genai))
    write_tokenizer(folder)
    return folder


def const(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array))
    graph.register_initializer(value)
    return value


def positions_from_mask(model: ir.Model) -> None:
    """Drop the position_ids input: cumsum(mask) - 1 over the new tokens, as GenAI graphs do."""
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs}
    positions = inputs["position_ids"]
    graph.inputs.remove(positions)
    axis = const(graph, "t.axis", np.array(1, np.int64))
    one = const(graph, "t.one", np.array(1, np.int64))
    index = const(graph, "t.index", np.array([1], np.int64))
    end = const(graph, "t.end", np.array([np.iinfo(np.int64).max], np.int64))
    axes = const(graph, "t.axes", np.array([1], np.int64))

    def node(op: str, args: list[ir.Value], name: str, **attributes: Any) -> ir.Node:
        return ir.node(op, args, attributes, outputs=[ir.Value(name=f"t.{name}")])

    cumsum = node("CumSum", [inputs["attention_mask"], axis], "cumsum")
    minus = node("Sub", [cumsum.outputs[0], one], "minus")
    shape = node("Shape", [inputs["input_ids"]], "shape")
    length = node("Gather", [shape.outputs[0], index], "length", axis=0)
    start = node("Neg", [length.outputs[0]], "start")
    sliced = ir.node("Slice", [minus.outputs[0], start.outputs[0], end, axes], outputs=[positions])
    graph.insert_before(graph.node(0), [cumsum, minus, shape, length, start, sliced])


def merged(model: ir.Model) -> ir.Model:
    """optimum's merged layout: a ``use_cache_branch`` input choosing between two branches. Each
    branch adds +100 to token FORCED when run on the wrong side (the with-past branch without a
    past, the no-past branch with one): fed right, the graph is the plain one."""
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs}
    logits = next(v for v in graph.outputs if v.name == "logits")
    flag = ir.Value(
        name="use_cache_branch", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.BOOL)
    )
    graph.inputs.append(flag)
    bias = np.zeros(80, np.float32)
    bias[FORCED] = 100.0
    bias_value = const(graph, "t.bias", bias)
    index = const(graph, "t.axis2", np.array([2], np.int64))
    zero = const(graph, "t.zero", np.array([0], np.int64))

    def node(op: str, args: list[ir.Value], name: str, **attributes: Any) -> ir.Node:
        return ir.node(op, args, attributes, outputs=[ir.Value(name=f"t.{name}")])

    shape = node("Shape", [inputs["past_key_values.0.key"]], "shape")
    length = node("Gather", [shape.outputs[0], index], "length", axis=0)
    empty = node("Equal", [length.outputs[0], zero], "empty")
    full = node("Not", [empty.outputs[0]], "full")
    empty_f = node("Cast", [empty.outputs[0]], "empty_f", to=ir.DataType.FLOAT)
    full_f = node("Cast", [full.outputs[0]], "full_f", to=ir.DataType.FLOAT)
    logits.name = "logits.raw"
    graph.outputs.remove(logits)
    branches = {}
    for branch, wrong in (("then", empty_f), ("else", full_f)):
        scaled = node("Mul", [bias_value, wrong.outputs[0]], f"{branch}.bias")
        added = node("Add", [logits, scaled.outputs[0]], f"{branch}.logits")
        branches[branch] = ir.Graph([], added.outputs, nodes=[scaled, added], name=branch)
    choose = ir.node(
        "If",
        [flag],
        {"then_branch": branches["then"], "else_branch": branches["else"]},
        outputs=[ir.Value(name="logits")],
    )
    graph.extend([shape, length, empty, full, empty_f, full_f, choose])
    graph.outputs.insert(0, choose.outputs[0])
    return model


def direct_greedy(
    model_file: Path, names: dict[str, str], steps: int, *, positions: bool, use_cache: bool
) -> list[int]:
    """Greedy ids from the stored graph run with its own names, cache handed back by hand."""
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    past = {names["past_key"] % i: None for i in range(2)}
    past |= {names["past_value"] % i: None for i in range(2)}
    cache = {k: np.zeros((1, 2, 0, 16), np.float32) for k in past}
    tokens, length, new = list(PROMPT), 0, []
    for _ in range(steps):
        x = np.array([tokens], np.int64)
        feeds = {"input_ids": x, "attention_mask": np.ones((1, length + len(tokens)), np.int64)}
        if positions:
            feeds["position_ids"] = np.arange(length, length + len(tokens))[None]
        if use_cache:
            feeds["use_cache_branch"] = np.array([length > 0])
        result = dict(zip(outputs, session.run(None, {**feeds, **cache}), strict=True))
        for i in range(2):
            for kind in ("key", "value"):
                cache[names[f"past_{kind}"] % i] = result[names[f"present_{kind}"] % i]
        length += len(tokens)
        token = int(np.argmax(result[names["logits"]][0, -1]))
        new.append(token)
        tokens = [token]
        if token in (2, 0):
            break
    return new


OPTIMUM_NAMES = {
    "past_key": "past_key_values.%d.key",
    "past_value": "past_key_values.%d.value",
    "present_key": "present.%d.key",
    "present_value": "present.%d.value",
    "logits": "logits",
}


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="ferry")


def manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "ferry.json").read_text())["generative"]


def test_optimum_folder_generates_as_the_graph_does(graph_bytes: bytes, tmp_path: Path) -> None:
    source = optimum_folder(tmp_path / "optimum", fresh(graph_bytes))
    assert (source / "model.onnx.data").is_file()
    assert decoder_source_kind(source) == "onnx-optimum"
    out = convert_decoder(source, tmp_path / "out")
    section = manifest(out)
    assert section["source_kind"] == "onnx-optimum" and section["layout"] == "optimum"
    assert section["model_file"] == "model.onnx" and "renamed" not in section
    assert section["flavour"] == "standard"
    assert section["precision"] == "fp32" and list(section["weights"]) == ["fp32"]
    assert section["verified"].startswith("runs: finite logits [1, 9, 80]")
    assert section["num_kv_heads"] == 2 and section["head_dim"] == 16
    assert section["context_length"] == 512 and section["eos_ids"] == [2]
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0] and generation["max_length"] == 512
    stored = ir.load(out / "model.onnx")
    assert stored.metadata_props["ferry.generative"] == "decoder"
    config = json.loads(stored.metadata_props["ferry.decoder_config"])
    assert (config["num_layers"], config["num_kv_heads"], config["head_dim"]) == (2, 2, 16)
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    expected = direct_greedy(
        source / "model.onnx", OPTIMUM_NAMES, 8, positions=True, use_cache=False
    )
    decoder = ferry.load(out)
    assert isinstance(decoder, DecoderSession)
    assert decoder.generate(ids=PROMPT, max_new_tokens=8).ids == expected
    chat = decoder.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=3)
    assert chat.prompt_tokens > 5


def test_genai_folder_is_renamed_to_the_optimum_names(graph_bytes: bytes, tmp_path: Path) -> None:
    source = genai_folder(tmp_path / "genai", fresh(graph_bytes))
    assert decoder_source_kind(source) == "onnx-genai"
    out = convert_decoder(source, tmp_path / "out")
    section = manifest(out)
    assert section["layout"] == "genai" and section["model_file"] == "decoder.onnx"
    assert section["renamed"]["past_key.1"] == "past_key_values.1.key"
    assert section["renamed"]["lm_logits"] == "logits"
    assert section["context_length"] == 128
    stored = ir.load(out / "model.onnx")
    inputs = [v.name for v in stored.graph.inputs]
    assert "position_ids" not in inputs and "past_key_values.0.value" in inputs
    assert next(v.name for v in stored.graph.outputs) == "logits"
    names = {
        "past_key": "past_key.%d",
        "past_value": "past_value.%d",
        "present_key": "present_key.%d",
        "present_value": "present_value.%d",
        "logits": "lm_logits",
    }
    expected = direct_greedy(source / "decoder.onnx", names, 8, positions=False, use_cache=False)
    # the same graph with positions fed: computing them inside changed nothing
    assert expected[:3] == direct_greedy(
        optimum_folder(tmp_path / "ref", fresh(graph_bytes)) / "model.onnx",
        OPTIMUM_NAMES,
        3,
        positions=True,
        use_cache=False,
    )
    assert ferry.load(out).generate(ids=PROMPT, max_new_tokens=8).ids == expected
    result = run("convert", str(source), "-o", str(tmp_path / "cli"))
    assert result.exit_code == 0, result.output
    assert "architecture: llama   layers: 2" in result.output and "checked: runs" in result.output


def test_merged_optimum_model_computes_use_cache_branch(graph_bytes: bytes, tmp_path: Path) -> None:
    source = optimum_folder(
        tmp_path / "merged", merged(fresh(graph_bytes)), name="decoder_model_merged.onnx"
    )
    (source / "decoder_model.onnx").write_bytes(b"")  # the split pair beside it is ignored
    out = convert_decoder(source, tmp_path / "out")
    assert manifest(out)["model_file"] == "decoder_model_merged.onnx"
    assert "use_cache_branch" not in [v.name for v in ir.load(out / "model.onnx").graph.inputs]
    expected = direct_greedy(
        source / "decoder_model_merged.onnx", OPTIMUM_NAMES, 6, positions=True, use_cache=True
    )
    assert FORCED not in expected  # fed right, no branch forces it
    assert ferry.load(out).generate(ids=PROMPT, max_new_tokens=6).ids == expected
    result = run("convert", str(source), "-o", str(tmp_path / "cli"))
    assert result.exit_code == 0, result.output


def one_error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def no_past_graph() -> ir.Model:
    """input_ids and attention_mask in, logits out, no cache: a decoder exported without past."""
    ids = ir.Value(
        name="input_ids", shape=ir.Shape(["b", "s"]), type=ir.TensorType(ir.DataType.INT64)
    )
    mask = ir.Value(
        name="attention_mask", shape=ir.Shape(["b", "t"]), type=ir.TensorType(ir.DataType.INT64)
    )
    cast = ir.node("Cast", [ids], attributes={"to": ir.DataType.FLOAT})
    axes = ir.Value(name="axes", const_value=ir.tensor(np.array([-1], np.int64)))
    logits = ir.node("Unsqueeze", [cast.outputs[0], axes])
    logits.outputs[0].name = "logits"
    graph = ir.Graph(
        [ids, mask],
        logits.outputs,
        nodes=[cast, logits],
        initializers=[axes],
        opset_imports={"": 17},
    )
    return ir.Model(graph, ir_version=9)


def test_bad_folders_say_what_is_wrong(graph_bytes: bytes, tmp_path: Path) -> None:
    good = optimum_folder(tmp_path / "good", fresh(graph_bytes), external=False)

    def variant(name: str) -> Path:
        folder = tmp_path / name
        shutil.copytree(good, folder)
        return folder

    no_model = variant("no_model")
    (no_model / "model.onnx").unlink()
    with pytest.raises(ModelLoadError, match="holds no model: no \\*.safetensors"):
        convert_decoder(no_model, tmp_path / "x")
    no_past = variant("no_past")
    ir.save(no_past_graph(), no_past / "model.onnx")
    with pytest.raises(
        ModelLoadError,
        match=r"not a decoder with past key/values \(model.onnx\): no input "
        r"past_key_values.0.key",
    ):
        convert_decoder(no_past, tmp_path / "x")
    no_tokenizer = variant("no_tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="has no tokenizer.json"):
        convert_decoder(no_tokenizer, tmp_path / "x")
    split = variant("split")
    (split / "model.onnx").rename(split / "decoder_with_past_model.onnx")
    (split / "decoder_model.onnx").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="without a merged model.*text-generation-with-past"):
        convert_decoder(split, tmp_path / "x")
    wrong_heads = variant("wrong_heads")
    config = json.loads((wrong_heads / "config.json").read_text())
    (wrong_heads / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 4}))
    with pytest.raises(ModelLoadError, match="says num_kv_heads 4, the graph .* has 2"):
        convert_decoder(wrong_heads, tmp_path / "x")
    with pytest.raises(InvalidInputError, match="taken as stored: precision int4 does not apply"):
        convert_decoder(good, tmp_path / "x", precision="int4")
    with pytest.raises(InvalidInputError, match="refusing to replace the source"):
        convert_decoder(good, good)
    genai = genai_folder(tmp_path / "genai", fresh(graph_bytes))
    data = json.loads((genai / "genai_config.json").read_text())
    data["model"]["decoder"]["inputs"]["past_key_names"] = "cache_key.%d"
    (genai / "genai_config.json").write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="no input cache_key.0"):
        convert_decoder(genai, tmp_path / "x")
    data["model"]["decoder"]["filename"] = "missing.onnx"
    (genai / "genai_config.json").write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="has no missing.onnx"):
        convert_decoder(genai, tmp_path / "x")
    int32 = variant("int32")
    model = fresh(graph_bytes)
    next(v for v in model.graph.inputs if v.name == "attention_mask").dtype = ir.DataType.INT32
    ir.save(model, int32 / "model.onnx")
    with pytest.raises(ModelLoadError, match="input attention_mask is INT32, not INT64"):
        convert_decoder(int32, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    # on the command line: one line, exit 2, nothing written
    said = one_error_line(run("convert", str(split), "-o", str(tmp_path / "y")))
    assert "text-generation-with-past" in said
    said = one_error_line(run("convert", str(no_past), "-o", str(tmp_path / "y")))
    assert "no input past_key_values.0.key" in said
    said = one_error_line(
        run("convert", str(good), "-o", str(tmp_path / "y"), "--precision", "int4")
    )
    assert "taken as stored" in said and "ferry quantize does not take decoders yet" in said
    assert not (tmp_path / "y").exists()


def test_a_plain_model_folder_is_left_to_the_onnx_converter(
    graph_bytes: bytes, tmp_path: Path
) -> None:
    """A folder with model.onnx but no causal-LM config.json (a classifier, a ferry artifact)
    is not taken for a decoder source."""
    folder = tmp_path / "plain"
    folder.mkdir()
    ir.save(no_past_graph(), folder / "model.onnx")
    assert decoder_source_kind(folder) is None
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    assert decoder_source_kind(folder) is None
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    assert decoder_source_kind(folder) == "onnx-optimum"


def test_a_graph_too_big_for_memory_is_checked_as_stored(
    graph_bytes: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over protobuf's limit the check runs on the source file with its own names (GenAI's
    templates, a merged model's use_cache_branch fed by hand) and still catches bad logits."""
    import ferry.generate._convert as convert

    monkeypatch.setattr(convert, "_IN_MEMORY_LIMIT", 0)
    genai = genai_folder(tmp_path / "genai", fresh(graph_bytes))
    section = manifest(convert_decoder(genai, tmp_path / "a"))
    assert section["verified"].startswith("runs (as stored in decoder.onnx): finite logits")
    merged_folder = optimum_folder(
        tmp_path / "merged", merged(fresh(graph_bytes)), name="decoder_model_merged.onnx"
    )
    section = manifest(convert_decoder(merged_folder, tmp_path / "b"))
    assert section["verified"].startswith("runs (as stored in decoder_model_merged.onnx)")
    # a graph whose cache path is wired wrong (keys and values of layer 0 swapped) is caught
    data = json.loads((genai / "genai_config.json").read_text())
    inputs = data["model"]["decoder"]["inputs"]
    inputs["past_key_names"], inputs["past_value_names"] = "past_value.%d", "past_key.%d"
    (genai / "genai_config.json").write_text(json.dumps(data))
    from ferry.errors import ConversionError

    with pytest.raises(ConversionError, match="cached step disagrees"):
        convert_decoder(genai, tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    ("flavour", "stored"), [("ort", "MatMulNBits"), ("standard", "DequantizeLinear")]
)
def test_a_quantized_graph_is_taken_as_stored(flavour: str, stored: str, tmp_path: Path) -> None:
    """An int4 graph (MatMulNBits, or blocked DequantizeLinear -> MatMul) keeps its blocks: the
    artifact says int4, as stored; a GPT-2 style config.json (n_head, n_layer, n_positions)
    gives the sizes too."""
    config_json, tensors = tiny_llama()
    config = DecoderConfig.from_hf(config_json)
    weights = DecoderWeights.from_hf(tensors, config)
    model = build_decoder(config, weights, precision="int4", flavour=flavour)
    model.metadata_props.clear()
    source = optimum_folder(tmp_path / "int4", model)
    gpt2_style = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "n_head": 4,
        "n_layer": 2,
        "n_embd": 64,
        "n_positions": 256,
        "vocab_size": 80,
        "eos_token_id": 2,
    }
    (source / "config.json").write_text(json.dumps(gpt2_style))
    out = convert_decoder(source, tmp_path / "out")
    section = manifest(out)
    assert section["precision"] == "int4" and section["flavour"] == flavour
    assert section["weights"][f"int4 ({stored})"] >= 8
    assert (section["num_heads"], section["hidden_size"], section["context_length"]) == (4, 64, 256)
    ops = {n.op_type for n in ir.load(out / "model.onnx").graph}
    assert stored in ops
    expected = direct_greedy(
        source / "model.onnx", OPTIMUM_NAMES, 5, positions=True, use_cache=False
    )
    assert ferry.load(out).generate(ids=PROMPT, max_new_tokens=5).ids == expected


def torch_exported_folder(folder: Path) -> tuple[Path, Any]:
    """An optimum-layout folder whose graph someone else wrote: transformers' own
    LlamaForCausalLM (the tiny llama's weights) exported by torch.onnx with a flat past/present
    per layer, as optimum's ``text-generation-with-past`` export names them."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache

    config_json, tensors = tiny_llama()
    hf_config = transformers.LlamaConfig(
        **{k: v for k, v in config_json.items() if k != "architectures"}
    )
    model = transformers.LlamaForCausalLM(hf_config).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    layers = config_json["num_hidden_layers"]

    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any
        ) -> tuple[Any, ...]:
            cache = DynamicCache(config=hf_config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            presents = [
                t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)
            ]
            return (out.logits, *presents)

    pasts = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    presents = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    axes |= {n: {0: "batch", 2: "past"} for n in pasts}
    axes |= {n: {0: "batch", 2: "total"} for n in presents}
    example = (
        torch.tensor([[1, 10, 20]]),
        torch.ones(1, 5, dtype=torch.int64),
        torch.arange(2, 5)[None],
        *[torch.randn(1, 2, 2, 16) for _ in pasts],
    )
    folder.mkdir(parents=True)
    with torch.no_grad():
        torch.onnx.export(
            Flat(),
            example,
            str(folder / "model.onnx"),
            input_names=["input_ids", "attention_mask", "position_ids", *pasts],
            output_names=["logits", *presents],
            dynamic_axes=axes,
            dynamo=False,
            opset_version=17,
        )
    (folder / "config.json").write_text(json.dumps(config_json))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    write_tokenizer(folder)
    return folder, model


def test_a_decoder_exported_from_transformers_generates_as_transformers(tmp_path: Path) -> None:
    """Not ferry's graph: transformers' model exported by torch.onnx, converted, generates the
    greedy tokens transformers' own generate gives."""
    folder, model = torch_exported_folder(tmp_path / "exported")
    import torch

    out = convert_decoder(folder, tmp_path / "out")
    assert manifest(out)["verified"].startswith("runs: finite logits [1, 9, 80]")
    ours = ferry.load(out).generate(ids=PROMPT, max_new_tokens=10).ids
    with torch.no_grad():
        reference = model.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=10,
            do_sample=False,
            eos_token_id=[2, 0],
            pad_token_id=2,
        )
    assert ours == reference[0, len(PROMPT) :].tolist()
    assert len(ours) == 10, ours  # no early eos: every step through the cache compared


@pytest.mark.slow
def test_the_kit_smollm2_as_a_genai_folder(tmp_path: Path) -> None:
    """The kit's SmolLM2 (int4 ort build, 30 layers) relaid as a GenAI folder with its own
    names: taken as stored (int4, ort), and it chats exactly as the artifact it came from."""
    from gguf_files import kit_gguf

    artifact = convert_decoder(kit_gguf(), tmp_path / "artifact")
    model = ir.load(artifact / "model.onnx")
    model.metadata_props.clear()
    for value in [*model.graph.inputs, *model.graph.outputs]:
        parts = (value.name or "").split(".")
        if parts[0] in ("past_key_values", "present"):
            side = "past" if parts[0] == "past_key_values" else "present"
            value.name = f"{side}_{parts[2]}.{parts[1]}"
    folder = tmp_path / "genai"
    folder.mkdir()
    save_model(model, folder / "model.onnx", external_data=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(artifact / name, folder / name)
    decoder = {
        "head_size": 64,
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "inputs": {k: v for k, v in GENAI_NAMES.items() if k.startswith("past")},
        "outputs": {k: v for k, v in GENAI_NAMES.items() if k.startswith("present")},
    }
    genai = {"model": {"eos_token_id": [2], "context_length": 8192, "decoder": decoder}}
    (folder / "genai_config.json").write_text(json.dumps(genai))
    out = convert_decoder(folder, tmp_path / "out")
    section = manifest(out)
    assert (section["precision"], section["flavour"]) == ("int4", "ort")
    assert section["verified"].startswith("runs: finite logits [1, 9, 49152]")
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    want = ferry.load(artifact).generate(messages=chat, max_new_tokens=12)
    got = ferry.load(out).generate(messages=chat, max_new_tokens=12)
    assert got.ids == want.ids and got.text == want.text
