"""The tokenizer rebuilt from GGUF metadata against transformers' own GGUF tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ferry.errors import InvalidInputError
from ferry.generate._template import ChatTemplate
from ferry.generate._tokenizer import build_tokenizer, special_token

gguf = pytest.importorskip("gguf")

KIT_GGUF = Path.home() / ".cache/ferry-kit/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ROOT = Path(__file__).resolve().parents[2]


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The file's metadata as plain Python values (what ferry.formats.read_gguf gives)."""
    try:
        from ferry.formats import read_gguf
    except ImportError:
        reader = gguf.GGUFReader(path)
        out = {}
        for key, field in reader.fields.items():
            if not key.startswith("GGUF."):
                value = field.contents()
                out[key] = value.item() if isinstance(value, np.generic) else value
        return out
    return dict(read_gguf(path).metadata)


def kit_chats() -> list[list[dict[str, str]]]:
    """The kit's 16 chat prompts (tests/real/kit, or the shared kit it is copied from)."""
    for folder in (ROOT / "tests/real/kit", ROOT.parent / "shared/kit"):
        spec = importlib.util.spec_from_file_location("_kit_inputs", folder / "inputs.py")
        if spec is None or spec.loader is None or not (folder / "inputs.py").is_file():
            continue
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "chat_prompts"):
            return module.chat_prompts(count=16)
    pytest.skip("the kit's inputs.py has no chat_prompts")


Smollm = tuple[dict[str, Any], Any, Any]


@pytest.fixture(scope="module")
def smollm() -> tuple[dict[str, Any], Any, Any]:
    """(metadata, our tokenizer, transformers' tokenizer) for the kit's SmolLM2 GGUF."""
    if not KIT_GGUF.is_file():
        pytest.skip(f"the kit's SmolLM2 GGUF is not at {KIT_GGUF} (scripts/fetch-kit.sh)")
    transformers = pytest.importorskip("transformers")
    metadata = gguf_metadata(KIT_GGUF)
    reference = transformers.AutoTokenizer.from_pretrained(
        str(KIT_GGUF.parent), gguf_file=KIT_GGUF.name
    )
    return metadata, build_tokenizer(metadata), reference


SAMPLES = [
    "Hello world",
    "héllo wörld, 日本語のテキスト, emoji 🚀🎉 and Ελληνικά",
    "3.5 metres is 350 cm; 42, 7, 19, 3, 28 sorted; pi = 3.14159",
    "def square(x):\n    return x ** 2\n\n\nprint(square(12))  # 144\n",
    "tabs\t\tand   spaces   \n\n  trailing   ",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text between<|endoftext|><jupyter_code>x = 1",
    "don't I'll we're they've it's",
    "",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_byte_level_matches_transformers(smollm: Smollm, text: str) -> None:
    _, ours, reference = smollm
    ids = ours.encode(text).ids
    assert ids == reference(text)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=False) == text


def test_kit_chat_prompts_match_transformers(smollm: Smollm) -> None:
    metadata, ours, reference = smollm
    template = ChatTemplate(
        metadata["tokenizer.chat_template"],
        bos_token=special_token(metadata, "bos"),
        eos_token=special_token(metadata, "eos"),
    )
    for chat in kit_chats():
        text = template.render(chat)
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == reference(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids, skip_special_tokens=False) == text


def test_digits_split_first_as_llama_cpp(smollm: Smollm) -> None:
    """SmolLM's pre-tokenizer ("smollm" in llama.cpp, StarCoder's) cuts every digit off before
    the GPT-2 regex runs, as its own tokenizer.json does (Digits, then ByteLevel). transformers'
    GGUF loader runs only the GPT-2 regex, which differs where spaces run into a number: there
    "  12" gives " ", " 1", "2" -> Ġ, Ġ, 1, 2, while llama.cpp gives "  ", "1", "2" -> ĠĠ, 1, 2."""
    _, ours, _ = smollm
    vocab = ours.get_vocab()
    assert ours.encode("  12").ids == [vocab["ĠĠ"], vocab["1"], vocab["2"]]
    # The vocabulary has no token joining an ASCII digit to anything, so elsewhere the two agree.
    assert not [t for t in vocab if len(t) > 1 and any(c in "0123456789" for c in t)]


def test_special_tokens_keep_their_ids(smollm: Smollm) -> None:
    metadata, ours, _ = smollm
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    control = [(i, t) for i, (t, k) in enumerate(zip(tokens, types)) if k == 3]
    assert len(control) == 17
    for index, token in control:
        assert ours.token_to_id(token) == index
        assert ours.encode(f"a{token}b").ids[1] == index
    assert ours.get_vocab_size() == len(tokens)
    # SmolLM's file says add_bos_token false: nothing is added around the text.
    assert ours.encode("hi").ids == ours.encode("hi", add_special_tokens=False).ids


def test_saved_tokenizer_loads_the_same(smollm: Smollm, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    _, ours, _ = smollm
    ours.save(str(tmp_path / "tokenizer.json"))
    again = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in SAMPLES:
        assert again.encode(text).ids == ours.encode(text).ids


# --------------------------------------------------------------------------- SentencePiece

_PIECES = [
    "▁", "h", "e", "l", "o", "w", "r", "d", "a", "t", "he", "ll", "llo", "hello", "▁hello",
    "or", "ld", "wor", "world", "▁world", "▁t", "▁a", "at", "▁th", "th", "▁the", "▁that", "▁▁",
    "  ", "   ", "!", ",", "\n", "\n\n",
]  # fmt: skip
# The special tokens first, as each family's files order them (transformers' Gemma tokenizer
# adds a "<mask>" of its own when the vocabulary lacks one; Gemma's has it at 4).
_HEADS = {
    "llama": ["<unk>", "<s>", "</s>"],
    "phi3": ["<unk>", "<s>", "</s>"],
    "gemma2": ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"],
}


def _tiny_sentencepiece(folder: Path, arch: str) -> Path:
    """A GGUF of architecture ``arch`` with a SentencePiece vocabulary: its special tokens, the
    256 byte tokens (type 6), scored pieces in shuffled score order and one control token (and
    the few model keys transformers' GGUF loader wants)."""
    head = _HEADS[arch]
    tokens = [*head, *(f"<0x{b:02X}>" for b in range(256)), *_PIECES, "<|user|>"]
    types = [3] * len(head) + [6] * 256 + [1] * len(_PIECES) + [3]
    order = np.random.default_rng(0).permutation(len(_PIECES))
    scores = [0.0] * (len(head) + 256) + [-float(i) for i in order] + [0.0]
    ids = {t: i for i, t in enumerate(head)}
    path = folder / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(ids.get("<s>", ids.get("<bos>")))
    writer.add_eos_token_id(ids.get("</s>", ids.get("<eos>")))
    writer.add_unk_token_id(ids["<unk>"])
    writer.add_add_bos_token(True)
    if arch == "gemma2":
        writer.add_add_space_prefix(False)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_key_length(4)
    writer.add_value_length(4)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


SP_SAMPLES = [
    "hello world",
    " hello  world",
    "the   that\n\nat",
    "héllo, world!",
    "<|user|>hello</s>",
    "  that\n",
    "wat 🚀",
]


@pytest.mark.parametrize("arch", sorted(_HEADS))
def test_sentencepiece_matches_transformers(tmp_path: Path, arch: str) -> None:
    """llama: Metaspace with the prefix space; phi3: the prefix space in the normalizer (text
    starting with a space keeps both); gemma: spaces as "▁" in the normalizer, no prefix, runs
    of spaces stored as spaces, merges in file order."""
    transformers = pytest.importorskip("transformers")
    path = _tiny_sentencepiece(tmp_path, arch)
    ours = build_tokenizer(gguf_metadata(path))
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in SP_SAMPLES:
        ids = ours.encode(text).ids
        assert ids == reference(text)["input_ids"], text
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)
    bos = _HEADS[arch][1 if arch != "gemma2" else 2]
    assert ours.encode("hello").tokens[0] == bos  # add_bos_token
    assert "<0xC3>" in ours.encode("é").tokens  # byte fallback
    assert ours.decode(ours.encode("héllo, world!").ids) == "héllo, world!"


def test_sentencepiece_prefix_space(tmp_path: Path) -> None:
    ours = build_tokenizer(gguf_metadata(_tiny_sentencepiece(tmp_path, "llama")))
    assert ours.encode("hello world").tokens == ["<s>", "▁hello", "▁world"]
    # The prefix goes before the text only, not after a special token inside it.
    assert ours.encode("<|user|>hello").tokens == ["<s>", "<|user|>", "hello"]


def test_unknown_tokenizer_model_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="'bert'.*supported: gpt2, llama"):
        build_tokenizer({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(InvalidInputError, match="no vocabulary"):
        build_tokenizer({"tokenizer.ggml.model": "gpt2"})
    with pytest.raises(InvalidInputError, match="pre-tokenizer 'klingon'"):
        build_tokenizer(
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "klingon",
                "tokenizer.ggml.tokens": ["a"],
                "tokenizer.ggml.merges": [],
            }
        )
