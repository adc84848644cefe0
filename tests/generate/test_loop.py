"""The token loop's bookkeeping on a tiny decoder graph built here (issue 29).

The graph's cache keeps each token's id (keys) and position (values); its next id is
``(sum of every id in the cache + 3 * last position + 5 * |mask length - last position - 1|)
mod VOCAB``, so the expected tokens follow only when the past is handed back whole, positions
count on and the mask grows by one per step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ferry
from ferry.errors import InvalidInputError
from ferry.generate._loop import DecoderSession, Generation, TokenEvent, is_generative_artifact

tokenizers = pytest.importorskip("tokenizers")

EOS_TOKEN = "<|eos|>"
VOCAB = 257  # 256 bytes + eos
HEADS, DIM = 2, 4


def byte_tokenizer() -> Any:
    """Byte-level BPE with one token per byte (ids 0..255 = the byte) and an eos (256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS_TOKEN])
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's printable stand-ins for bytes, as the ByteLevel pre-tokenizer uses them.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_decoder(context: int = 64, dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    f = helper.make_node
    c = helper.make_tensor
    nodes = [
        f("Cast", ["input_ids"], ["ids_f"], to=dtype),
        f("Unsqueeze", ["ids_f", "axes13"], ["ids4"]),
        f("Expand", ["ids4", "kv_shape"], ["k_new"]),
        f("Concat", ["past_key_values.0.key", "k_new"], ["present.0.key"], axis=2),
        f("Cast", ["position_ids"], ["pos_f"], to=dtype),
        f("Unsqueeze", ["pos_f", "axes13"], ["pos4"]),
        f("Expand", ["pos4", "kv_shape"], ["v_new"]),
        f("Concat", ["past_key_values.0.value", "v_new"], ["present.0.value"], axis=2),
        f("Cast", ["present.0.key"], ["keys32"], to=TensorProto.FLOAT),
        f("ReduceSum", ["keys32"], ["key_sum"], keepdims=0),
        f("Div", ["key_sum", "per_token"], ["id_sum"]),
        f("Cast", ["position_ids"], ["pos32"], to=TensorProto.FLOAT),
        f("ReduceMax", ["pos32"], ["last_pos"], keepdims=0),
        f("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        f("ReduceSum", ["mask_f"], ["mask_len"], keepdims=0),
        f("Sub", ["mask_len", "last_pos"], ["d0"]),
        f("Sub", ["d0", "one"], ["d1"]),
        f("Abs", ["d1"], ["err"]),
        f("Mul", ["last_pos", "three"], ["p3"]),
        f("Mul", ["err", "five"], ["e5"]),
        f("Add", ["id_sum", "p3"], ["s0"]),
        f("Add", ["s0", "e5"], ["s1"]),
        f("Mod", ["s1", "vocab_f"], ["next_f"], fmod=1),
        f("Cast", ["next_f"], ["next0"], to=TensorProto.INT64),
        f("Reshape", ["next0", "one_i"], ["next"]),
        f("OneHot", ["next", "depth", "hot"], ["onehot"], axis=-1),
        f("Reshape", ["onehot", "row_shape"], ["row"]),
        f("Shape", ["input_ids"], ["ids_shape"]),
        f("Concat", ["ids_shape", "one_i"], ["logits_shape"], axis=0),
        f("Expand", ["row", "logits_shape"], ["logits"]),
    ]
    inits = [
        c("axes13", TensorProto.INT64, [2], [1, 3]),
        c("kv_shape", TensorProto.INT64, [4], [1, HEADS, 1, DIM]),
        c("per_token", TensorProto.FLOAT, [], [HEADS * DIM]),
        c("one", TensorProto.FLOAT, [], [1.0]),
        c("three", TensorProto.FLOAT, [], [3.0]),
        c("five", TensorProto.FLOAT, [], [5.0]),
        c("vocab_f", TensorProto.FLOAT, [], [float(VOCAB)]),
        c("depth", TensorProto.INT64, [], [VOCAB]),
        c("hot", TensorProto.FLOAT, [2], [0.0, 3.0]),
        c("row_shape", TensorProto.INT64, [3], [1, 1, VOCAB]),
        c("one_i", TensorProto.INT64, [1], [1]),
    ]
    kv = ["batch", HEADS, "past", DIM]
    present = ["batch", HEADS, "total", DIM]
    graph = helper.make_graph(
        nodes,
        "tiny_decoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("past_key_values.0.key", dtype, kv),
            helper.make_tensor_value_info("past_key_values.0.value", dtype, kv),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB]),
            helper.make_tensor_value_info("present.0.key", dtype, present),
            helper.make_tensor_value_info("present.0.value", dtype, present),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(
        model,
        {
            "ferry.generative": "decoder",
            "ferry.decoder_config": json.dumps({"context_length": context}),
        },
    )
    onnx.checker.check_model(model)
    return model


def expected(prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append((sum(ids) + 3 * (len(ids) - 1)) % VOCAB)
    return ids[len(prompt) :]


def make(context: int = 64, eos: list[int] | None = None, **kwargs: Any) -> DecoderSession:
    session = ferry.load(tiny_decoder(context, **kwargs))
    config = {"eos_token_id": eos if eos is not None else []}
    return DecoderSession(session, byte_tokenizer(), _Template(), config)


class _Template:
    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


PROMPT = "hello"
PROMPT_IDS = list(PROMPT.encode())


def test_greedy_follows_the_cache_positions_and_mask() -> None:
    gen = make().generate(PROMPT, max_new_tokens=20)
    assert isinstance(gen, Generation)
    assert gen.ids == expected(PROMPT_IDS, 20)
    assert gen.finish_reason == "length" and gen.prompt_tokens == len(PROMPT_IDS)
    assert gen.text == byte_tokenizer().decode(gen.ids)
    assert make().generate(ids=PROMPT_IDS, max_new_tokens=20).ids == gen.ids  # deterministic


def test_fp16_cache() -> None:
    gen = make(dtype=TensorProto.FLOAT16).generate(PROMPT, max_new_tokens=6)
    assert gen.ids == expected(PROMPT_IDS, 6)


def test_messages_go_through_the_template() -> None:
    messages = [{"role": "user", "content": "hi"}]
    prompt = list(b"<user>hi<assistant>")
    gen = make().generate(messages=messages, max_new_tokens=4)
    assert gen.ids == expected(prompt, 4) and gen.prompt_tokens == len(prompt)


def test_eos_stops() -> None:
    want = expected(PROMPT_IDS, 30)
    eos = want[6]
    first = want.index(eos)
    gen = make(eos=[eos]).generate(PROMPT, max_new_tokens=30)
    assert gen.finish_reason == "stop"
    assert gen.ids == want[: first + 1]
    assert gen.text == byte_tokenizer().decode(want[:first])


def test_stop_string_trims_the_text() -> None:
    want = expected(PROMPT_IDS, 30)
    full = byte_tokenizer().decode(want)
    stop = full[10:12]
    at = full.find(stop)
    gen = make().generate(PROMPT, max_new_tokens=30, stop=[stop, "never-seen"])
    assert gen.finish_reason == "stop"
    assert gen.text == full[:at]
    events = list(make().generate(PROMPT, max_new_tokens=30, stop=stop, stream=True))
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == full[:at]


def test_streaming_gives_the_same_tokens_in_order() -> None:
    session = make()
    items = list(session.generate(PROMPT, max_new_tokens=25, stream=True))
    events, final = items[:-1], items[-1]
    assert all(isinstance(e, TokenEvent) for e in events) and isinstance(final, Generation)
    assert [e.id for e in events] == final.ids == session.generate(PROMPT, max_new_tokens=25).ids
    assert "".join(e.text for e in events) == final.text


def test_seed_reproduces_sampling() -> None:
    session = make()
    runs = [
        session.generate(PROMPT, max_new_tokens=15, temperature=1.0, top_k=20, seed=s).ids
        for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_context_limits() -> None:
    session = make(context=10)
    gen = session.generate(PROMPT, max_new_tokens=100)
    assert gen.finish_reason == "length" and len(gen.ids) == 10 - len(PROMPT_IDS)
    assert gen.ids == expected(PROMPT_IDS, 5)
    with pytest.raises(InvalidInputError, match="prompt is 10 tokens; the context is 10"):
        session.generate("0123456789", max_new_tokens=3)


def test_bad_calls_are_one_clear_error() -> None:
    session = make()
    with pytest.raises(InvalidInputError, match="top_q.*it takes prompt"):
        session.generate(PROMPT, top_q=0.3)
    with pytest.raises(InvalidInputError, match="temperature"):
        session.generate(PROMPT, temperature=-1, stream=True)  # at the call, not when iterated
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        session.generate(PROMPT, max_new_tokens=0)
    with pytest.raises(InvalidInputError, match="one non-empty prompt"):
        session.generate()
    with pytest.raises(InvalidInputError, match="got prompt, ids"):
        session.generate(PROMPT, ids=[1])
    with pytest.raises(InvalidInputError, match="outside the vocabulary"):
        session.generate(ids=[1, 999])
    with pytest.raises(InvalidInputError, match="stop"):
        session.generate(PROMPT, stop=[""])


class _Scripted:
    """A stand-in runtime session whose logits spell out a fixed list of ids, one per step."""

    def __init__(self, script: list[int]) -> None:
        from ferry.runtime import TensorSpec

        self.script = list(script)
        self.model = None
        self.inputs = [
            TensorSpec("input_ids", ("batch", "seq"), np.dtype(np.int64), "INT64"),
            TensorSpec("attention_mask", ("batch", "total"), np.dtype(np.int64), "INT64"),
        ]
        self.output_names = ["logits"]
        self.optional_inputs: list[Any] = []

    def run(
        self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        logits = np.zeros((1, feeds["input_ids"].shape[1], VOCAB), dtype=np.float32)
        logits[0, -1, self.script.pop(0)] = 1.0
        return {"logits": logits}

    def kv_runner(self, layout: Any) -> Any:
        from ferry.backends import CopyingKVRunner

        return CopyingKVRunner(self.run, layout)


def test_multibyte_characters_are_emitted_whole() -> None:
    text = "aé€😀b"
    script = list(text.encode())
    session = DecoderSession(_Scripted(script), byte_tokenizer())  # type: ignore[arg-type]
    events = list(session.generate(ids=[1], max_new_tokens=len(script), stream=True))[:-1]
    pieces = [e.text for e in events]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[:3] == ["a", "", "é"]


def test_facade_and_detection(tmp_path: Path) -> None:
    onnx.save(tiny_decoder(), tmp_path / "model.onnx")
    assert is_generative_artifact(tmp_path)
    assert not is_generative_artifact(tmp_path / "model.onnx")
    plain = tmp_path / "plain"
    plain.mkdir()
    model = tiny_decoder()
    del model.metadata_props[:]
    onnx.save(model, plain / "model.onnx")
    assert not is_generative_artifact(plain)
    (plain / "ferry.json").write_text(json.dumps({"generative": {"config": {}}}))
    assert is_generative_artifact(plain)


def test_facade_loads_a_generative_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    onnx.save(tiny_decoder(), tmp_path / "model.onnx")
    called: dict[str, Any] = {}

    def from_folder(cls: type, folder: Path, **load_options: Any) -> DecoderSession:
        called.update(load_options, folder=folder)
        session = ferry.load(Path(folder) / "model.onnx", **load_options)
        return DecoderSession(session, byte_tokenizer())

    monkeypatch.setattr(DecoderSession, "from_folder", classmethod(from_folder))
    decoder: Any = ferry.load(tmp_path, threads=1)
    assert isinstance(decoder, DecoderSession)
    assert called["folder"] == tmp_path and called["threads"] == 1
    assert decoder.generate(PROMPT, max_new_tokens=3).ids == expected(PROMPT_IDS, 3)
    # The model file itself is an ordinary model.
    assert not isinstance(ferry.load(tmp_path / "model.onnx"), DecoderSession)


@pytest.mark.parametrize("name", ["llama_gqa", "gemma2"])
def test_a_tiny_random_real_decoder(name: str) -> None:
    """build_decoder's graph through the loop: greedy ids as a full recompute of the reference
    forward gives them, up to the context its metadata carries."""
    import dataclasses

    from tests.generate.test_graph_decoder import CONFIGS, make_weights, reference

    from ferry.generate._graph import build_decoder

    config = dataclasses.replace(CONFIGS[name], vocab_size=VOCAB, context_length=16)
    weights = make_weights(config, seed=3)
    session = DecoderSession(ferry.load(build_decoder(config, weights)), byte_tokenizer())
    assert session.context_length == 16 and session.num_layers == config.num_layers
    gen = session.generate(ids=PROMPT_IDS, max_new_tokens=100)
    assert gen.finish_reason == "length" and len(gen.ids) == 16 - len(PROMPT_IDS)
    ids = list(PROMPT_IDS)
    for got in gen.ids:
        logits = reference(config, weights, np.array(ids))[-1]
        top2 = np.sort(logits)[-2:]
        if top2[1] - top2[0] < 1e-3:
            break  # a near-tie: float32 may pick either; what follows differs legitimately
        assert got == int(np.argmax(logits))
        ids.append(got)
    else:
        assert ids[len(PROMPT_IDS) :] == gen.ids


def test_text_that_may_begin_a_stop_string_is_held_back() -> None:
    from ferry.generate._text import safe_end as _safe_end

    assert _safe_end("hello wo", 0, ["world"]) == len("hello ")
    assert _safe_end("hello wo", 0, ["x", "o w", "world"]) == len("hello ")
    assert _safe_end("abc\ufffd", 0, ["zz"]) == 3
    assert _safe_end("abc", 2, ["cd"]) == 2
    assert _safe_end("abc", 2, ["bcd"]) == 3  # what was given out stays given
