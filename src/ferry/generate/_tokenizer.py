"""The tokenizer a GGUF file describes, built as a Hugging Face ``tokenizers.Tokenizer``.

A GGUF carries no ``tokenizer.json``: it stores the vocabulary (``tokenizer.ggml.tokens``), the
merges or the SentencePiece scores, the token types and the special token ids as metadata under
llama.cpp's key names. This module rebuilds from them the tokenizer that llama.cpp runs:

- ``tokenizer.ggml.model == "gpt2"``: byte-level BPE from the tokens and merges, its text split
  first by the pre-tokenizer regexes llama.cpp uses for ``tokenizer.ggml.pre`` (llama.cpp applies
  them one after the other, each on the pieces the previous one left, which is what a
  ``Sequence`` of ``Split`` pre-tokenizers does);
- ``"llama"``: a SentencePiece vocabulary as BPE with byte fallback, its merges recovered from the
  tokens' scores (as transformers' GGUF converter does), spaces written as "▁" and a space put
  before the text when ``tokenizer.ggml.add_space_prefix`` says so (the default); Gemma and
  Phi-3 files get their families' own space handling, as transformers builds them.

Tokens the file marks as control (type 3) become special added tokens and user-defined ones
(type 4) plain added tokens, so that both are matched whole in the text.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ferry.errors import InvalidInputError

__all__ = ["SUPPORTED_TOKENIZERS", "build_tokenizer", "special_token"]

#: ``tokenizer.ggml.model`` values this module builds.
SUPPORTED_TOKENIZERS = ("gpt2", "llama")

# Token types as llama.cpp's gguf writer numbers them (gguf.TokenType).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_GEMMA = frozenset({"gemma", "gemma2", "gemma3"})

# llama.cpp's pre-tokenizer regexes (src/llama-vocab.cpp), by tokenizer.ggml.pre. Each list is
# applied in order; an empty list means the GPT-2 regex that tokenizers' ByteLevel applies itself.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("default", "gpt2", "mpt", "olmo", "jais", "trillion"), ()),
    # StarCoder-style vocabularies (SmolLM's among them) cut every digit off first.
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"),
        (r"\p{N}", _GPT2),
    ),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx", "smaug-bpe"),
        (_LLAMA3,),
    ),
    **dict.fromkeys(("qwen2", "stablelm2", "deepseek-r1-qwen", "megrez"), (_QWEN2,)),
    **dict.fromkeys(("gpt-4o", "llama4"), (_GPT4O,)),
}


def special_token(metadata: Mapping[str, Any], name: str) -> str | None:
    """The text of the special token ``name`` ("bos", "eos", "unknown", "padding", "eot"...)
    whose id ``tokenizer.ggml.<name>_token_id`` names, or None when the file names none."""
    token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
    tokens = metadata.get("tokenizer.ggml.tokens") or ()
    if token_id is None or not 0 <= int(token_id) < len(tokens):
        return None
    return str(tokens[int(token_id)])


def build_tokenizer(metadata: Mapping[str, Any]) -> Any:
    """The ``tokenizers.Tokenizer`` that GGUF ``metadata`` describes.

    Args:
        metadata: a GGUF file's metadata as plain Python values (``read_gguf(path).metadata``).

    Returns:
        A ``tokenizers.Tokenizer`` whose ids are the file's token ids. It adds the BOS token
        in front of the text when ``tokenizer.ggml.add_bos_token`` says so (a SentencePiece
        vocabulary that does not say adds it, as llama.cpp does).

    Raises:
        InvalidInputError: the metadata has no vocabulary, or a tokenizer model other than
            those in ``SUPPORTED_TOKENIZERS``.
    """
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise InvalidInputError("the GGUF metadata has no vocabulary (tokenizer.ggml.tokens)")
    if kind == "gpt2":
        tokenizer = _byte_level(metadata, list(tokens))
    elif kind == "llama":
        tokenizer = _sentencepiece(metadata, list(tokens))
    else:
        raise InvalidInputError(
            f"cannot build a tokenizer for tokenizer.ggml.model {kind!r}; "
            f"supported: {', '.join(SUPPORTED_TOKENIZERS)}"
        )
    _add_bos(tokenizer, metadata, default=kind == "llama")
    return tokenizer


@functools.cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level BPE spelling): printable
    Latin-1 bytes stand for themselves, the others for the code points from 256 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return table


def _byte_level(metadata: Mapping[str, Any], tokens: list[str]) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = str(metadata.get("tokenizer.ggml.pre") or "default")
    if pre not in _PRE_SPLITS:
        raise InvalidInputError(
            f"unknown byte-level pre-tokenizer {pre!r} (tokenizer.ggml.pre); known: "
            f"{', '.join(sorted(_PRE_SPLITS))}"
        )
    alphabet = set(_byte_alphabet().values())
    spelling = _byte_alphabet()
    # A token written outside the byte alphabet (a llama.cpp converter's respelling) is looked up
    # by its bytes, as transformers' GGUF converter does.
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode()): index
        for index, token in enumerate(tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges") or ()]
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    splits = _PRE_SPLITS[pre]
    if splits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    # Control tokens spelled outside the byte alphabet are mislabelled ordinary tokens.
    _add_marked_tokens(tokenizer, metadata, tokens, keep=lambda t: set(t) <= alphabet)
    return tokenizer


def _sentencepiece(metadata: Mapping[str, Any], tokens: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    arch = str(metadata.get("general.architecture") or "")
    gemma = arch in _GEMMA
    scores = metadata.get("tokenizer.ggml.scores")
    if gemma:
        # Gemma files store a token of two or more spaces as spaces; its text reaches the model
        # with spaces written as "▁", so the token is looked up (and merged) that way.
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    # The last of duplicate tokens wins, as in llama.cpp's token_to_id and transformers.
    vocab = {token: index for index, token in enumerate(tokens)}
    if metadata.get("tokenizer.ggml.merges"):
        merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    elif gemma:
        # Gemma's scores do not follow its merge order; the order of the tokens in the file does.
        merges = _merges_from_scores(vocab, {t: -float(i) for i, t in enumerate(tokens)})
    elif scores is not None and len(scores) == len(tokens):
        merges = _merges_from_scores(vocab, dict(zip(tokens, (float(x) for x in scores))))
    else:
        raise InvalidInputError(
            "a SentencePiece (llama) vocabulary needs tokenizer.ggml.scores, one per token"
        )
    unk = special_token(metadata, "unknown")
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    add_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", not gemma))
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        # transformers' GemmaTokenizer: spaces become "▁" in the normalizer, no prefix space.
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        add_prefix = False
    elif arch == "phi3":
        # Phi-3's own tokenizer.json puts the prefix space in the normalizer: text starting with
        # a space keeps both ("  hi" -> "▁▁▁hi", not Metaspace's "▁▁hi").
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
            if add_prefix
            else [normalizers.Replace(" ", "▁")]
        )
    else:
        # "first": the space goes before the text, not before each piece between special
        # tokens, as transformers' non-legacy Llama tokenizer and llama.cpp do.
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first" if add_prefix else "never", split=False
        )
    if add_prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    tokenizer.decoder = decoders.Sequence(steps)
    _add_marked_tokens(tokenizer, metadata, tokens, keep=lambda t: True)
    return tokenizer


def _merges_from_scores(
    vocab: Mapping[str, int], scores: Mapping[str, float]
) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's choices: every split of a token into two known
    pieces, the best-scored tokens' merges first (transformers' ``generate_merges``)."""
    found: list[tuple[str, str, float]] = []
    for token, score in scores.items():
        local = [
            (token[:i], token[i:], score)
            for i in range(1, len(token))
            if token[:i] in vocab and token[i:] in vocab
        ]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _add_marked_tokens(
    tokenizer: Any,
    metadata: Mapping[str, Any],
    tokens: Sequence[str],
    keep: Callable[[str], bool],
) -> None:
    """Control tokens (and the named bos/eos/unk/pad) as special added tokens; user-defined ones
    as plain added tokens: both matched whole in the text instead of cut into pieces."""
    from tokenizers import AddedToken

    types = metadata.get("tokenizer.ggml.token_type") or ()
    special = [t for t, k in zip(tokens, types) if int(k) == _CONTROL and keep(t)]
    for name in ("bos", "eos", "unknown", "padding"):
        token = special_token(metadata, name)
        if token is not None and token not in special and keep(token):
            special.append(token)
    if special:
        tokenizer.add_special_tokens(
            [AddedToken(t, normalized=False, special=True) for t in special]
        )
    user = [t for t, k in zip(tokens, types) if int(k) == _USER_DEFINED]
    if user:
        tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _add_bos(tokenizer: Any, metadata: Mapping[str, Any], *, default: bool) -> None:
    """A post-processor putting BOS (and EOS) around the text where the file asks for them."""
    from tokenizers import processors

    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", default))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    bos, eos = special_token(metadata, "bos"), special_token(metadata, "eos")
    add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
    if not (add_bos or add_eos):
        return
    single = f"{bos}:0 " * add_bos + "$A:0" + f" {eos}:0" * add_eos
    pair = single + f" {bos}:1" * add_bos + " $B:1" + f" {eos}:1" * add_eos
    named = [
        (t, int(metadata[f"tokenizer.ggml.{n}_token_id"]))
        for n, t, on in (("bos", bos, add_bos), ("eos", eos, add_eos))
        if on
    ]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=named
    )
