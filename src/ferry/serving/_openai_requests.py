"""The OpenAI API's and Triton's generate extension's requests and answers, as plain data.

A request body (already parsed JSON) is checked field by field into :class:`GenerateParams` and a
prompt (chat messages, a text or token ids); every bad or unsupported field is refused with an
:class:`OpenAIError` naming it (``param``), never ignored in silence. The answers (complete
responses and streamed chunks) are built by :class:`ReplyShape`. Nothing here touches the engine
or HTTP: the routes (``_openai.py``, ``_triton_generate.py``) do.

What is taken, what is refused, and why:

- Sampling: ``temperature`` (0..2; OpenAI's default 1), ``top_p`` (0, 1], ``seed``, ``stop`` (a
  string or up to 4), ``max_tokens`` / ``max_completion_tokens`` (>= 1; default: what the context
  leaves). Extensions vLLM also takes: ``top_k``, ``repetition_penalty``.
- Refused by name: ``n`` other than 1, non-zero ``presence_penalty`` / ``frequency_penalty``,
  ``logprobs``, ``top_logprobs``, ``logit_bias``, ``response_format`` other than text, tools and
  functions, ``echo``, ``suffix``, ``best_of`` other than 1, audio output, prediction, web search.
- Ignored, as they change nothing here: ``user``, ``store``, ``metadata``, ``service_tier``,
  ``parallel_tool_calls``, ``reasoning_effort``; unknown fields are ignored, as OpenAI does.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ferry.serving._http import HTTPError

if TYPE_CHECKING:
    from ferry.generate import GenerationRequest, SamplingOptions

__all__ = [
    "GenerateParams",
    "OpenAIError",
    "ReplyShape",
    "chat_request",
    "check_prompt_ids",
    "completion_request",
    "generation_request",
    "invalid",
    "triton_request",
]

#: OpenAI's most stop strings.
MAX_STOPS = 4
#: Roles a chat message may have ("developer" is OpenAI's newer name for "system").
ROLES = ("system", "developer", "user", "assistant")


class OpenAIError(HTTPError):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

    Args:
        status: the HTTP status.
        message: what is wrong and what to do.
        param: the request field at fault (``"messages[0].content"``), None when none is.
        code: OpenAI's machine-readable code (``"context_length_exceeded"``), or None.
        type: OpenAI's error type (``"invalid_request_error"``...).
        headers: response headers (``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, message, headers)
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(param: str | None, message: str, code: str | None = None) -> OpenAIError:
    """A 400 ``invalid_request_error`` about ``param``."""
    return OpenAIError(400, message, param=param, code=code)


@dataclass(frozen=True)
class GenerateParams:
    """What a request asks of the engine, checked.

    Attributes:
        model: the model's name.
        max_tokens: at most this many new tokens; None: what the context leaves.
        sampling: how tokens are chosen.
        stop: strings that end the answer (cut before the first).
        stream: send tokens as they come (server-sent events).
        include_usage: with ``stream``, a last chunk with the token counts.
    """

    model: str
    max_tokens: int | None
    sampling: SamplingOptions
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False


# -- requests -------------------------------------------------------------------------------------


def chat_request(body: Mapping[str, Any]) -> tuple[GenerateParams, list[dict[str, str]]]:
    """``POST /v1/chat/completions``'s body: its parameters and its messages, each
    ``{"role", "content"}`` with text content (a list of text parts joined by newlines).

    Raises:
        OpenAIError: a missing, malformed or unsupported field (named).
    """
    _refuse_unsupported(body, chat=True)
    return _params(body), _messages(body.get("messages"))


def completion_request(body: Mapping[str, Any]) -> tuple[GenerateParams, str | list[int]]:
    """``POST /v1/completions``'s body: its parameters and its prompt (a text, or token ids).

    Raises:
        OpenAIError: a missing, malformed or unsupported field (named).
    """
    _refuse_unsupported(body, chat=False)
    return _params(body), _prompt(body.get("prompt"))


#: Triton generate's sampling parameters, in ``"parameters"`` or (TensorRT-LLM's ensembles) at
#: the top level of the body.
TRITON_PARAMETERS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "seed",
    "stop",
    "stream",
    "exclude_input_in_output",
)


def triton_request(
    body: Mapping[str, Any], model: str, *, stream: bool
) -> tuple[GenerateParams, str, bool]:
    """Triton's generate body (``{"text_input": ..., "parameters": {...}}``): its parameters, its
    text and whether the answer leaves the prompt out (``exclude_input_in_output``, default true).

    Args:
        body: the request body.
        model: the model named in the path.
        stream: the route streams (``generate_stream``).

    Raises:
        OpenAIError: a missing, malformed or unknown field (named; the known ones listed).
    """
    parameters = body.get("parameters")
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, Mapping):
        raise invalid("parameters", "'parameters' must be an object")
    unknown = sorted(
        k for k in body if k not in ("text_input", "parameters", "id", *TRITON_PARAMETERS)
    )
    unknown += sorted(k for k in parameters if k not in TRITON_PARAMETERS)
    if unknown:
        raise invalid(
            unknown[0],
            f"unknown field {unknown[0]!r}; generate takes text_input, id and parameters "
            f"{', '.join(TRITON_PARAMETERS)}",
        )
    both = sorted(set(body) & set(parameters))
    if both:
        raise invalid(both[0], f"{both[0]!r} is given twice, at the top and in 'parameters'")
    merged = {**{k: body[k] for k in TRITON_PARAMETERS if k in body}, **parameters}
    wants_stream = merged.pop("stream", None)
    if wants_stream is not None and not isinstance(wants_stream, bool):
        raise invalid("stream", f"stream={wants_stream!r}: it takes true or false")
    if wants_stream and not stream:
        raise invalid(
            "stream",
            f"stream=true on /generate: send it to /v2/models/{model}/generate_stream",
        )
    exclude = merged.pop("exclude_input_in_output", True)
    if not isinstance(exclude, bool):
        raise invalid(
            "exclude_input_in_output",
            f"exclude_input_in_output={exclude!r}: it takes true or false",
        )
    text = body.get("text_input")
    if not isinstance(text, str) or not text:
        raise invalid("text_input", "'text_input' must be a non-empty string (the prompt)")
    return _params({**merged, "model": model, "stream": stream}), text, exclude


def generation_request(
    params: GenerateParams, prompt_ids: Sequence[int], context_length: int, param: str
) -> GenerationRequest:
    """The engine's request for a prompt: ``max_tokens`` clipped to what the context leaves
    (the answer then ends with "length", as ``ferry generate``'s does), or all of it.

    Args:
        params: the request's parameters.
        prompt_ids: the prompt, tokenized.
        context_length: the engine's context (prompt and new tokens).
        param: the field holding the prompt (``"messages"``, ``"prompt"``), for the errors.

    Raises:
        OpenAIError: an empty prompt; one that fills the context (code
            ``context_length_exceeded``).
    """
    from ferry.generate import GenerationRequest

    if not prompt_ids:
        raise invalid(param, f"the prompt is empty: '{param}' gave no tokens")
    room = context_length - len(prompt_ids)
    if room < 1:
        raise invalid(
            param,
            f"this model's context is {context_length} tokens; the prompt is "
            f"{len(prompt_ids)} tokens and leaves no room for an answer: shorten the {param}",
            code="context_length_exceeded",
        )
    wanted = room if params.max_tokens is None else min(params.max_tokens, room)
    return GenerationRequest(list(prompt_ids), wanted, params.sampling, params.stop)


def check_prompt_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    """Token ids given as the prompt, each within the vocabulary.

    Raises:
        OpenAIError: an id outside ``[0, vocab_size)``.
    """
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise invalid(
            "prompt",
            f"prompt token ids {bad[:5]} are outside this model's vocabulary [0, {vocab_size})",
        )
    return list(ids)


# Unsupported fields: each refused unless it has one of the values that mean "off".
_OFF: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "echo": (None, False),
    "suffix": (None, ""),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
    "modalities": (None, ["text"]),
}

_WHY = {
    "n": "this server returns one choice per request; send n requests instead",
    "best_of": "this server returns one choice per request and does not rank several",
    "presence_penalty": "ferry's sampler has no presence or frequency penalty "
    "(repetition_penalty, a vLLM extension, is taken)",
    "logprobs": "this server does not return log probabilities",
    "top_logprobs": "this server does not return log probabilities",
    "logit_bias": "this server does not bias tokens",
    "tools": "this server has no tool calling",
    "response_format": 'this server has no structured output; only {"type": "text"}',
    "echo": "this server does not echo the prompt",
    "suffix": "this server does not insert text",
    "audio": "this server answers with text only",
    "modalities": "this server answers with text only",
    "prediction": "this server takes no predicted output",
    "web_search_options": "this server does not search the web",
}
_WHY["frequency_penalty"] = _WHY["presence_penalty"]
_WHY["functions"] = _WHY["tool_choice"] = _WHY["function_call"] = _WHY["tools"]


def _refuse_unsupported(body: Mapping[str, Any], *, chat: bool) -> None:
    for name, off in _OFF.items():
        if name in body and not _among(body[name], off):
            raise invalid(name, f"{name}={body[name]!r} is not supported: {_WHY[name]}")
    logprobs = body.get("logprobs")
    # Chat's logprobs is a flag; completions' a count (0 asks for the sampled token's).
    if logprobs is not None and (not chat or logprobs is not False):
        raise invalid("logprobs", f"logprobs={logprobs!r} is not supported: {_WHY['logprobs']}")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        kind = response_format.get("type") if isinstance(response_format, Mapping) else None
        raise invalid(
            "response_format",
            f"response_format type {kind!r} is not supported: {_WHY['response_format']}",
        )


def _among(value: Any, allowed: tuple[Any, ...]) -> bool:
    for a in allowed:
        if isinstance(value, bool) or isinstance(a, bool):
            if value is a:  # bool is an int to Python: n=true is not n=1
                return True
        elif value == a:
            return True
    return False


def _params(body: Mapping[str, Any]) -> GenerateParams:
    from ferry.generate import SamplingOptions

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "'model' is required: the name of a served model (GET /v1/models)")
    max_tokens = _max_tokens(body)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0, "a number from 0 to 2")
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, "a number in (0, 1]", open_low=True)
    top_k = _integer(body, "top_k", 0, "an int >= 0 (0 or -1: off)", low=-1)
    penalty = _number(body, "repetition_penalty", 1.0, 0.0, math.inf, "a number > 0", True)
    seed = _integer(body, "seed", None, "an int")
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid("stream", f"stream={stream!r}: it takes true or false")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, Mapping):
            raise invalid("stream_options", "'stream_options' must be an object")
        asked = options.get("include_usage")
        if asked is not None and not isinstance(asked, bool):
            raise invalid(
                "stream_options.include_usage", f"include_usage={asked!r}: it takes true or false"
            )
        include_usage = bool(asked)
    # The ranges are OpenAI's, checked above (SamplingOptions' own are wider).
    sampling = SamplingOptions(
        temperature=temperature,
        top_k=max(0, top_k or 0),
        top_p=top_p,
        repetition_penalty=penalty,
        # The engine's generator takes seeds >= 0; OpenAI's are any int64.
        seed=None if seed is None else seed % 2**64,
    )
    return GenerateParams(
        model, max_tokens, sampling, _stop(body.get("stop")), stream, include_usage
    )


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    found: dict[str, int] = {}
    for name in ("max_completion_tokens", "max_tokens"):
        value = _integer(body, name, None, "an int >= 1", low=1)
        if value is not None:
            found[name] = value
    if len(set(found.values())) > 1:
        raise invalid(
            "max_tokens",
            f"max_tokens={found['max_tokens']} and max_completion_tokens="
            f"{found['max_completion_tokens']} disagree; give one",
        )
    return next(iter(found.values()), None)


def _number(
    body: Mapping[str, Any],
    name: str,
    default: float,
    low: float,
    high: float,
    takes: str,
    open_low: bool = False,
) -> float:
    value = body.get(name)
    if value is None:
        return default
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and (value > low if open_low else value >= low)
        and value <= high
    )
    if not ok:
        raise invalid(name, f"{name}={value!r} is out of range: it takes {takes}")
    return float(value)


def _integer(
    body: Mapping[str, Any], name: str, default: int | None, takes: str, low: int | None = None
) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    # JSON clients send 5.0 for 5 at times; a whole float is that int.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        raise invalid(name, f"{name}={value!r} is out of range: it takes {takes}")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop", f"stop={value!r}: it takes a non-empty string or a list of them")
    if len(stops) > MAX_STOPS:
        raise invalid("stop", f"stop has {len(stops)} strings; at most {MAX_STOPS} are taken")
    return tuple(dict.fromkeys(stops))


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise invalid(
            "messages",
            '\'messages\' is required: a non-empty list of {"role", "content"} objects',
        )
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise invalid(where, f"{where} must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in ROLES:
            hint = " (this server has no tool calling)" if role in ("tool", "function") else ""
            raise invalid(
                f"{where}.role",
                f"{where}.role={role!r} is not supported{hint}; it takes {', '.join(ROLES)}",
            )
        for name in ("tool_calls", "function_call", "audio"):
            if message.get(name) is not None:
                raise invalid(
                    f"{where}.{name}", f"{where}.{name} is not supported: {_WHY['tools']}"
                )
        out.append(
            {
                "role": "system" if role == "developer" else role,
                "content": _content(message.get("content"), f"{where}.content"),
            }
        )
    return out


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid(where, f"{where} must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            raise invalid(
                f"{where}[{j}]",
                f"{where}[{j}]: content part type {kind!r} is not supported: this model takes "
                'text only ({"type": "text", "text": ...})',
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid(f"{where}[{j}].text", f"{where}[{j}].text must be a string")
        texts.append(text)
    return "\n".join(texts)


def _prompt(value: Any) -> str | list[int]:
    # OpenAI takes a text, token ids, or a list of either (a batch); one prompt per request here.
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise invalid("prompt", "'prompt' is empty")
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    ):
        return list(value)
    if (
        isinstance(value, list)
        and len(value) > 1
        and all(isinstance(p, (str, list)) for p in value)
    ):
        raise invalid(
            "prompt",
            f"'prompt' holds {len(value)} prompts; this server takes one per request: send "
            "one request per prompt",
        )
    raise invalid(
        "prompt", "'prompt' is required: a non-empty string, or a non-empty list of token ids"
    )


# -- answers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplyShape:
    """How one request's answers look: a chat completion or a text completion.

    Attributes:
        chat: a chat completion (messages and deltas), else a text completion.
        model: the model's name, as answered.
        id: the answer's id (``chatcmpl-...`` or ``cmpl-...``).
        created: unix seconds.
    """

    chat: bool
    model: str
    id: str
    created: int

    @classmethod
    def new(cls, chat: bool, model: str) -> ReplyShape:
        prefix = "chatcmpl-" if chat else "cmpl-"
        return cls(chat, model, prefix + uuid.uuid4().hex, int(time.time()))

    def _head(self, chunk: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def complete(
        self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        """The whole answer (not streamed)."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        return {
            **self._head(False),
            "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens),
        }

    def chunk(
        self,
        text: str | None = None,
        *,
        first: bool = False,
        finish_reason: str | None = None,
        with_usage: bool = False,
    ) -> dict[str, Any]:
        """One streamed chunk: the first (chat: the role), one with text, or the last (its
        finish reason). ``with_usage``: the ``"usage": null`` every chunk carries when the
        request asked for the usage chunk."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
                delta["content"] = ""
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        out = {**self._head(True), "choices": [choice]}
        if with_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The chunk after the last, with ``stream_options.include_usage``: no choices."""
        return {**self._head(True), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
