"""The token loop: a decoder graph run once over the prompt (prefill), then once per new token
with the key/value cache handed back, each next id chosen by the sampler, the text decoded as
the tokens come.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, overload

import numpy as np

from ferry.backends import KVLayout, KVRunner
from ferry.errors import InvalidInputError, ModelLoadError
from ferry.generate._sampling import Sampler, sampling_options
from ferry.generate._text import SequenceText

if TYPE_CHECKING:
    from ferry.runtime import Session

__all__ = ["DecoderSession", "Generation", "TokenEvent", "is_generative_artifact"]

#: The model's metadata key that marks a generative decoder, and the one holding its config.
GENERATIVE_KEY = "ferry.generative"
CONFIG_KEY = "ferry.decoder_config"
DEFAULT_MAX_NEW_TOKENS = 256
_PAST = re.compile(r"past_key_values\.(\d+)\.key")


@dataclass(frozen=True)
class TokenEvent:
    """One new token while streaming: its id and the text it completes (may be empty while a
    multi-byte character or a possible stop string is held back; a later event carries it)."""

    id: int
    text: str


@dataclass(frozen=True)
class Generation:
    """A finished generation.

    Attributes:
        text: the new text (special tokens skipped, cut before a stop string).
        ids: the new token ids, the eos id or the token completing a stop string included.
        finish_reason: "stop" (an eos id or a stop string) or "length" (max_new_tokens or the
            context reached).
        prompt_tokens: how many tokens the prompt was.
    """

    text: str
    ids: list[int]
    finish_reason: str
    prompt_tokens: int


class DecoderSession:
    """A decoder graph (the I/O of ``ferry.generate.build_decoder``: ``input_ids``,
    ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key|value`` in; ``logits``,
    ``present.{i}.key|value`` out) with its tokenizer, chat template and generation defaults.

    Args:
        session: a runtime Session on the decoder graph.
        tokenizer: a ``tokenizers.Tokenizer``.
        template: an object with ``.render(messages, add_generation_prompt=True) -> str``;
            None: ``messages=`` is refused.
        generation_config: ``generation_config.json``'s content: ``eos_token_id`` (an id or a
            list), ``max_length`` (the context length).
        context_length: the context; None: ``max_length`` above, else the graph's
            ``ferry.decoder_config`` metadata, else no limit.
    """

    def __init__(
        self,
        session: Session,
        tokenizer: Any,
        template: Any = None,
        generation_config: Mapping[str, Any] | None = None,
        *,
        context_length: int | None = None,
    ) -> None:
        self.session = session
        #: With ``backends="auto"``: what was measured and chosen (a ``DecoderChoice``).
        self.auto: Any = None
        self.tokenizer = tokenizer
        self.template = template
        self.generation_config = dict(generation_config or {})
        config = _graph_config(session)
        names = {s.name: s for s in session.inputs}
        missing = [n for n in ("input_ids", "attention_mask") if n not in names]
        if missing or "logits" not in session.output_names:
            raise ModelLoadError(
                "not a decoder graph: it needs inputs input_ids, attention_mask (and "
                "past_key_values.{i}.key/value) and output logits; missing "
                + ", ".join(missing + ([] if "logits" in session.output_names else ["logits"]))
            )
        self._positions = "position_ids" in names
        #: The graph can run its output head on the last positions only (ferry's graphs).
        self._keep = any(s.name == "logits_to_keep" for s in session.optional_inputs)
        layers = sorted(int(m.group(1)) for n in names if (m := _PAST.fullmatch(n)))
        self.num_layers = len(layers)
        self._past = tuple(
            f"past_key_values.{i}.{kind}" for i in layers for kind in ("key", "value")
        )
        self._present = tuple(f"present.{i}.{kind}" for i in layers for kind in ("key", "value"))
        absent = [n for n in self._present if n not in session.output_names]
        if absent:
            raise ModelLoadError(
                "not a decoder graph: its past inputs have no present outputs "
                + ", ".join(absent[:4])
            )
        #: Whether the graph writes new slots into a past as wide as the sequence's capacity
        #: (GroupQueryAttention reads every past), so the engine may share past and present.
        self.in_place_cache = bool(self._past) and _in_place(session, self._past)
        self._kv: tuple[int, int, Any] = (0, 0, np.float32)
        if layers:
            spec = names["past_key_values.0.key"]
            shape = spec.shape or ()
            heads = shape[1] if len(shape) == 4 and isinstance(shape[1], int) else None
            dim = shape[3] if len(shape) == 4 and isinstance(shape[3], int) else None
            heads = heads or config.get("num_kv_heads")
            dim = dim or config.get("head_dim")
            if not heads or not dim:
                raise ModelLoadError(
                    "the decoder's past_key_values.0.key has no fixed kv-heads and head-dim "
                    f"sizes ({shape}) and its metadata does not give them ({CONFIG_KEY})"
                )
            self._kv = (int(heads), int(dim), spec.dtype or np.float32)
        if context_length is None:
            context_length = self.generation_config.get("max_length") or config.get(
                "context_length"
            )
        self.context_length: int | None = int(context_length) if context_length else None
        eos = self.generation_config.get("eos_token_id")
        eos = config.get("eos_ids") if eos is None else eos
        self.eos_ids: frozenset[int] = frozenset(
            [] if eos is None else [eos] if isinstance(eos, int) else eos
        )
        if self._past:
            # Prepare the engine's cache now, not in the first generate (OpenVINO compiles its
            # stateful model here).
            self.kv_runner(1)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str], **load_options: Any) -> DecoderSession:
        """The artifact folder ``ferry convert`` writes for a decoder: its ``model.onnx`` loaded
        with ``ferry.runtime.load(..., **load_options)``, its tokenizer, template and generation
        config read by ``ferry.generate`` (``load_decoder_files``)."""
        from ferry.generate._artifact import load_decoder_files
        from ferry.runtime import load

        files = load_decoder_files(folder)
        session = load(Path(folder) / "model.onnx", **load_options)
        return cls(session, files.tokenizer, files.template, files.generation_config)

    @overload
    def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        ids: Sequence[int] | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
        stream: Literal[False] = False,
        **unknown: Any,
    ) -> Generation: ...

    @overload
    def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        ids: Sequence[int] | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
        stream: Literal[True],
        **unknown: Any,
    ) -> Iterator[TokenEvent | Generation]: ...

    def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        ids: Sequence[int] | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
        stream: bool = False,
        **unknown: Any,
    ) -> Generation | Iterator[TokenEvent | Generation]:
        """Generate new tokens after a prompt.

        Give exactly one of ``prompt`` (text, tokenized with the tokenizer's special tokens),
        ``messages`` (``[{"role": ..., "content": ...}]``, rendered through the chat template
        with the generation prompt) or ``ids`` (token ids as they are).

        A prompt of the context's length or longer is refused; when the prompt plus
        ``max_new_tokens`` exceeds the context, generation runs up to the context and finishes
        with "length".

        Args:
            prompt: the prompt text.
            messages: chat messages.
            ids: prompt token ids.
            max_new_tokens: at most this many new tokens (>= 1).
            temperature: 0 for greedy (deterministic); else sampled at this temperature.
            top_k: sample among the k most likely (0: all).
            top_p: sample in the nucleus of this probability (1: all).
            repetition_penalty: > 1 discourages ids already in the prompt or generated.
            seed: the sampler's seed: the same seed gives the same tokens.
            stop: strings that end generation; the text is cut before the first one.
            stream: yield a :class:`TokenEvent` per token as it comes, then the
                :class:`Generation`.
            **unknown: refused, naming the options generate takes.

        Returns:
            A :class:`Generation`, or with ``stream=True`` an iterator of :class:`TokenEvent`
            ending with the :class:`Generation`.

        Raises:
            InvalidInputError: an unknown option, a bad value, no prompt or more than one,
                ``messages`` without a chat template, a prompt that fills the context.
        """
        if unknown:
            raise InvalidInputError(
                f"unknown generate option {', '.join(map(repr, sorted(unknown)))}; it takes "
                "prompt, messages, ids, max_new_tokens, temperature, top_k, top_p, "
                "repetition_penalty, seed, stop, stream"
            )
        options = sampling_options(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            seed=seed,
        )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise InvalidInputError(f"max_new_tokens={max_new_tokens!r}: it takes an int >= 1")
        if max_new_tokens < 1:
            raise InvalidInputError(f"max_new_tokens={max_new_tokens!r}: it takes an int >= 1")
        stops = [stop] if isinstance(stop, str) else list(stop)
        if any(not isinstance(s, str) or not s for s in stops):
            raise InvalidInputError(f"stop={stop!r}: it takes non-empty strings")
        prompt_ids = self._prompt_ids(prompt, messages, ids)
        budget = max_new_tokens
        if self.context_length is not None:
            if len(prompt_ids) >= self.context_length:
                raise InvalidInputError(
                    f"the prompt is {len(prompt_ids)} tokens; the context is "
                    f"{self.context_length} tokens (with max_new_tokens={max_new_tokens}, "
                    "the prompt must leave room for at least one new token)"
                )
            budget = min(budget, self.context_length - len(prompt_ids))
        steps = self._steps(prompt_ids, budget, Sampler(options), stops)
        if stream:
            return steps
        for item in steps:
            if isinstance(item, Generation):
                return item
        raise AssertionError("the token loop ended without a Generation")  # pragma: no cover

    def _prompt_ids(
        self,
        prompt: str | None,
        messages: Sequence[Mapping[str, Any]] | None,
        ids: Sequence[int] | None,
    ) -> list[int]:
        given = [n for n, v in (("prompt", prompt), ("messages", messages), ("ids", ids)) if v]
        if len(given) != 1:
            raise InvalidInputError(
                "give one non-empty prompt: prompt=, messages= or ids="
                + (f" (got {', '.join(given)})" if given else "")
            )
        if messages:
            if self.template is None:
                raise InvalidInputError("this decoder has no chat template; give prompt= or ids=")
            text = self.template.render(list(messages), add_generation_prompt=True)
            # The template writes the special tokens itself (transformers tokenizes it so too).
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        if prompt:
            if not isinstance(prompt, str):
                raise InvalidInputError(f"prompt must be a str, not {type(prompt).__name__}")
            return list(self.tokenizer.encode(prompt, add_special_tokens=True).ids)
        vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        out = [int(i) for i in ids or ()]
        bad = [i for i in out if not 0 <= i < vocab]
        if bad or any(isinstance(i, bool) for i in ids or ()):
            raise InvalidInputError(f"ids: {bad[:5]} outside the vocabulary [0, {vocab})")
        return out

    def kv_layout(self, capacity: int) -> KVLayout:
        """The cache of one sequence of up to ``capacity`` slots (prompt + new tokens)."""
        heads, dim, dtype = self._kv
        return KVLayout(
            self._past,
            self._present,
            "logits",
            heads,
            dim,
            dtype,
            capacity,
            self.in_place_cache,
        )

    def kv_runner(self, capacity: int) -> KVRunner:
        """A runner for one new sequence of up to ``capacity`` slots (prompt + new tokens),
        the cache kept by the engine where it can (``Session.kv_runner``)."""
        return self.session.kv_runner(self.kv_layout(capacity))

    @property
    def keeps_last_logits(self) -> bool:
        """The graph can run its output head on the last positions only (``logits_to_keep``)."""
        return self._keep

    @property
    def takes_positions(self) -> bool:
        """The graph reads ``position_ids``."""
        return self._positions

    def step(
        self, runner: KVRunner, tokens: Sequence[int], used: int, *, last_only: bool = False
    ) -> np.ndarray:
        """Run ``tokens`` after the ``used`` slots already in ``runner``'s cache: the logits
        ``[len(tokens), vocab]``, or only the last position's ``[1, vocab]`` with
        ``last_only`` where the graph can skip the rest (its ``logits_to_keep`` input)."""
        n = len(tokens)
        if runner.in_place:
            capacity = runner.layout.capacity
            if used + n > capacity:
                raise InvalidInputError(
                    f"the sequence needs {used + n} cache slots; its cache holds {capacity}"
                )
            mask = np.zeros((1, capacity), dtype=np.int64)
            mask[0, : used + n] = 1
        else:
            mask = np.ones((1, used + n), dtype=np.int64)
        feeds = {"input_ids": np.asarray([tokens], dtype=np.int64), "attention_mask": mask}
        if self._positions:
            feeds["position_ids"] = np.arange(used, used + n, dtype=np.int64)[None]
        if last_only and self._keep:
            feeds["logits_to_keep"] = np.array(1, dtype=np.int64)
        logits: np.ndarray = runner.run(feeds)
        return logits[0]

    def _steps(
        self, prompt_ids: list[int], budget: int, sampler: Sampler, stops: list[str]
    ) -> Iterator[TokenEvent | Generation]:
        runner = self.kv_runner(len(prompt_ids) + budget)
        used = 0
        seen = list(prompt_ids)
        text = SequenceText(self.tokenizer, self.eos_ids, stops, budget)
        tokens = prompt_ids  # the prefill: the whole prompt in one call
        while text.finish_reason is None:
            token = sampler(self.step(runner, tokens, used, last_only=True)[-1], seen)
            used += len(tokens)
            seen.append(token)
            tokens = [token]
            yield TokenEvent(token, text.add(token))
        yield Generation(text.text, text.ids, text.finish_reason, len(prompt_ids))


def _in_place(session: Session, past: Sequence[str]) -> bool:
    """Every past input is read only by GroupQueryAttention (which writes the new slots into
    a past buffer as wide as the mask and gives it back as the present)."""
    readers: dict[str, list[Any]] = {name: [] for name in past}
    for node in session.model.graph.all_nodes():
        for value in node.inputs:
            if value is not None and value.name in readers:
                readers[value.name].append(node)
    return all(
        nodes and all(n.op_type == "GroupQueryAttention" for n in nodes)
        for nodes in readers.values()
    )


def _graph_config(session: Session) -> dict[str, Any]:
    """The decoder config the graph's metadata carries (``ferry.decoder_config``), or {}."""
    props = getattr(session.model, "metadata_props", None) or {}
    try:
        config = json.loads(props.get(CONFIG_KEY, "{}"))
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def is_generative_artifact(source: object) -> TypeGuard[str | os.PathLike[str]]:
    """Whether ``source`` is a folder holding a generative decoder: its ``ferry.json`` has a
    "generative" section, or (a folder without ``ferry.json``) its ``model.onnx`` carries the
    ``ferry.generative`` metadata."""
    if not isinstance(source, (str, os.PathLike)) or not Path(source).is_dir():
        return False
    folder = Path(source)
    try:
        manifest = json.loads((folder / "ferry.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    if isinstance(manifest, dict):
        # ferry's own artifacts say so in their manifest: no second parse of a large model.
        return "generative" in manifest
    model = folder / "model.onnx"
    if not model.is_file():
        return False
    import onnx

    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception:  # an unreadable model is runtime.load's to report, not ours
        return False
    return any(p.key == GENERATIVE_KEY for p in proto.metadata_props)
