"""Perplexity of a text under a decoder: the text's tokens teacher-forced through the graph (the
prompt-and-cache path the token loop uses, in chunks), every next token's log-probability taken
from a float64 log-softmax of the logits.

It measures how much a build changed the model (an int4 artifact against its source, ferry
against llama.cpp on the same GGUF) on ordinary text rather than on a handful of greedy answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.errors import InvalidInputError

if TYPE_CHECKING:
    from ferry.generate._loop import DecoderSession

__all__ = ["PerplexityResult", "log_softmax_nll", "perplexity", "teacher_forced_logits"]

#: Tokens per graph call while scoring: the logits of a chunk are chunk x vocab floats.
DEFAULT_CHUNK = 256
_PAST = re.compile(r"past_key_values\.(\d+)\.key")


@dataclass(frozen=True)
class PerplexityResult:
    """A text's perplexity under a decoder.

    Attributes:
        tokens: how many tokens were predicted (scored): every token of each window but its
            first.
        nll: the mean negative log-likelihood of those tokens, in nats per token.
        ppl: ``exp(nll)``.
        ids: the token ids scored (the text as the tokenizer encodes it, bos included when the
            tokenizer adds one), so that another engine can score the very same sequence.
        window: the window the ids were cut into (each scored from a fresh cache).
        token_nll: each predicted token's negative log-likelihood, in order (float64).
    """

    tokens: int
    nll: float
    ppl: float
    ids: tuple[int, ...]
    window: int
    token_nll: np.ndarray = field(repr=False, compare=False)


def log_softmax_nll(logits: np.ndarray, targets: Sequence[int] | np.ndarray) -> np.ndarray:
    """``-log softmax(logits)[target]`` row by row, computed in float64.

    Args:
        logits: [n, vocab] scores.
        targets: n ids.

    Returns:
        [n] float64 negative log-likelihoods.
    """
    x = np.asarray(logits, dtype=np.float64)
    top = x.max(axis=-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(x - top).sum(axis=-1))
    picked = x[np.arange(len(x)), np.asarray(targets, dtype=np.int64)]
    out: np.ndarray = lse - picked
    return out


def perplexity(
    session: DecoderSession,
    text: str | Sequence[int],
    *,
    window: int | None = None,
    chunk: int = DEFAULT_CHUNK,
) -> PerplexityResult:
    """The perplexity of ``text`` under the decoder.

    The text is tokenized with the artifact's tokenizer, special tokens added as the tokenizer
    adds them (a bos where it has one); a sequence of ints is scored as it is. The ids are cut
    into consecutive windows of ``window`` tokens, each scored from an empty cache: its tokens go
    through the graph ``chunk`` at a time with the key/value cache handed back (as a prompt is
    prefilled), and each position's logits score the next token of the window. The perplexity is
    ``exp`` of the mean negative log-likelihood over every predicted token.

    Args:
        session: a decoder (``ferry.load(artifact)``); its graph must take the past key/values
            as inputs and give the logits of every position.
        text: the text, or token ids.
        window: tokens per window (>= 2); None: the whole text in one window, or the model's
            context when the text is longer.
        chunk: tokens per graph call (>= 1); the result does not depend on it beyond rounding.

    Returns:
        A :class:`PerplexityResult`.

    Raises:
        InvalidInputError: fewer than 2 tokens, a window or chunk out of range, a window longer
            than the model's context, ids outside the vocabulary, or a graph that does not give
            per-position logits from past key/values.
    """
    ids = _ids(session, text)
    if len(ids) < 2:
        raise InvalidInputError(
            f"perplexity needs at least 2 tokens (one to predict); the text gives {len(ids)}"
        )
    context = session.context_length
    if window is None:
        window = len(ids) if context is None else min(len(ids), context)
    for name, value, least in (("window", window, 2), ("chunk", chunk, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidInputError(f"{name}={value!r}: it takes an int >= {least}")
    if context is not None and window > context:
        raise InvalidInputError(f"window={window} exceeds the model's context of {context} tokens")
    nlls: list[np.ndarray] = []
    for start in range(0, len(ids), window):
        part = ids[start : start + window]
        if len(part) < 2:  # a lone last token: nothing in its window predicts it
            continue
        # The last token is only a target: no position after it is scored.
        for done, logits in _chunk_logits(session, part[:-1], chunk):
            nlls.append(log_softmax_nll(logits, part[done + 1 : done + 1 + len(logits)]))
    token_nll = np.concatenate(nlls)
    nll = float(token_nll.mean())
    return PerplexityResult(
        tokens=len(token_nll),
        nll=nll,
        ppl=float(np.exp(nll)),
        ids=tuple(ids),
        window=window,
        token_nll=token_nll,
    )


def teacher_forced_logits(
    session: DecoderSession, ids: Sequence[int], *, chunk: int = DEFAULT_CHUNK
) -> np.ndarray:
    """The logits after each of ``ids`` ([len(ids), vocab], the graph's float type), the ids fed
    ``chunk`` at a time through the key/value cache from an empty one: row i scores the token
    that follows ``ids[:i + 1]``.

    Raises:
        InvalidInputError: no ids, ids outside the vocabulary, or a graph that does not give
            per-position logits from past key/values.
    """
    ids = _ids(session, ids)
    if not ids or isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise InvalidInputError(f"teacher_forced_logits takes ids and a chunk >= 1, got {chunk!r}")
    return np.concatenate([logits for _, logits in _chunk_logits(session, ids, chunk)])


def _chunk_logits(
    session: DecoderSession, ids: Sequence[int], chunk: int
) -> Iterator[tuple[int, np.ndarray]]:
    """``(offset, [n, vocab] logits)`` for each chunk of ``ids`` run through the graph, the past
    key/values of the chunks before it handed back (an empty cache first)."""
    layers, empty = _empty_past(session)
    positions = "position_ids" in session.session.input_names
    past = {
        f"past_key_values.{i}.{kind}": empty for i in range(layers) for kind in ("key", "value")
    }
    for done in range(0, len(ids), chunk):
        n = min(chunk, len(ids) - done)
        feeds: dict[str, np.ndarray] = {
            "input_ids": np.asarray([ids[done : done + n]], dtype=np.int64),
            "attention_mask": np.ones((1, done + n), dtype=np.int64),
            **past,
        }
        if positions:
            feeds["position_ids"] = np.arange(done, done + n, dtype=np.int64)[None]
        outputs = session.session.run(feeds)
        logits = np.asarray(outputs["logits"])
        if logits.ndim != 3 or logits.shape[1] != n:
            raise InvalidInputError(
                f"the decoder gives logits of shape {list(logits.shape)} for {n} tokens; "
                "scoring a text needs every position's logits ([1, tokens, vocab])"
            )
        past = {name: outputs[name.replace("past_key_values", "present")] for name in past}
        yield done, logits[0]


def _ids(session: DecoderSession, text: str | Sequence[int]) -> list[int]:
    if isinstance(text, str):
        return list(session.tokenizer.encode(text, add_special_tokens=True).ids)
    ids = [int(i) for i in text]
    vocab = session.tokenizer.get_vocab_size(with_added_tokens=True)
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise InvalidInputError(f"ids: {bad[:5]} outside the vocabulary [0, {vocab})")
    return ids


def _empty_past(session: DecoderSession) -> tuple[int, np.ndarray]:
    """The number of layers and an empty [1, kv_heads, 0, head_dim] past of the graph's dtype,
    from the past inputs' specs (or the ``ferry.decoder_config`` metadata for symbolic dims)."""
    specs = {s.name: s for s in session.session.inputs}
    layers = sorted(int(m.group(1)) for name in specs if (m := _PAST.fullmatch(name)))
    if not layers:
        raise InvalidInputError(
            "perplexity feeds the past key/values itself: the decoder graph has no "
            "past_key_values.{i}.key inputs"
        )
    spec = specs["past_key_values.0.key"]
    shape = tuple(spec.shape or ())
    config = _metadata_config(session)
    heads = shape[1] if len(shape) == 4 and isinstance(shape[1], int) else None
    dim = shape[3] if len(shape) == 4 and isinstance(shape[3], int) else None
    heads = heads or config.get("num_kv_heads")
    dim = dim or config.get("head_dim")
    if not heads or not dim:
        raise InvalidInputError(
            f"the decoder's past_key_values.0.key has no fixed kv-heads and head-dim sizes "
            f"({list(shape)}) and its metadata does not give them"
        )
    dtype = spec.dtype or np.float32
    return len(layers), np.zeros((1, int(heads), 0, int(dim)), dtype=dtype)


def _metadata_config(session: DecoderSession) -> dict[str, Any]:
    from ferry.generate._loop import CONFIG_KEY

    props = getattr(session.session.model, "metadata_props", None) or {}
    try:
        config = json.loads(props.get(CONFIG_KEY, "{}"))
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}
