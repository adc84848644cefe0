"""A model's chat template, rendered with jinja2 exactly as transformers' ``apply_chat_template``.

Chat templates are Jinja programs shipped with models (in a GGUF's ``tokenizer.chat_template``,
in ``tokenizer_config.json``). What they render is the prompt the model was trained on, so the
environment must be transformers' own: a sandbox that cannot mutate its inputs, trimmed block
whitespace, ``loopcontrols``, the ``raise_exception`` and ``strftime_now`` globals, a ``tojson``
that does not HTML-escape, and the special tokens (``bos_token``, ``eos_token``...) as variables.
Everything the template sees is first rebuilt from plain JSON-like values, as transformers does,
so that no object with methods reaches the sandbox.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from ferry.errors import InvalidInputError

__all__ = ["ChatTemplate"]


class ChatTemplate:
    """A chat template and the special tokens it may name.

    Args:
        source: the Jinja source.
        bos_token: the text of the beginning-of-sequence token (``bos_token`` in the template).
        eos_token: the text of the end-of-sequence token (``eos_token`` in the template).
        **special_tokens: other special tokens the template may read (``pad_token``,
            ``unk_token``), None for absent ones.

    Raises:
        InvalidInputError: the source is not a valid Jinja template.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None,
        eos_token: str | None,
        **special_tokens: str | None,
    ) -> None:
        self.source = source
        self.special_tokens = {
            name: token
            for name, token in {
                "bos_token": bos_token,
                "eos_token": eos_token,
                **special_tokens,
            }.items()
            if token is not None
        }
        import jinja2

        try:
            self._compiled = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise InvalidInputError(f"the chat template does not parse: {_describe(e)}") from e

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The conversation as the prompt text the model reads.

        Args:
            messages: {"role", "content", ...} dicts; keys whose value is None are dropped, as
                transformers does.
            add_generation_prompt: end with the header that opens the assistant's turn.
            **extra: more variables for the template (``tools``, ``documents``,
                ``enable_thinking``...); they override the special tokens of the same name.

        Raises:
            InvalidInputError: ``messages`` is empty or holds something other than dicts, or the
                template refused them (its ``raise_exception``) or failed.
        """
        import jinja2

        if isinstance(messages, (str, bytes)) or not messages:
            raise InvalidInputError("a chat needs at least one message ({'role', 'content'} dict)")
        chat = []
        for message in messages:
            if not isinstance(message, Mapping):
                raise InvalidInputError(
                    f"a chat message is a {{'role', 'content'}} dict, not {message!r}"
                )
            chat.append({k: v for k, v in _plain(message).items() if v is not None})
        variables = {
            **self.special_tokens,
            "tools": _plain(extra.pop("tools", None)),
            "documents": _plain(extra.pop("documents", None)),
            **{k: _plain(v) for k, v in extra.items()},
        }
        try:
            return str(
                self._compiled.render(
                    messages=_alias_reasoning(chat),
                    add_generation_prompt=add_generation_prompt,
                    **variables,
                )
            )
        except jinja2.TemplateError as e:
            raise InvalidInputError(f"the chat template failed: {_describe(e)}") from e
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise InvalidInputError(f"the chat template failed: {type(e).__name__}: {e}") from e

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars, {self.special_tokens})"


def _describe(error: Exception) -> str:
    line = getattr(error, "lineno", None)
    return f"{error} (line {line})" if line else str(error)


# A message's reasoning goes by several names; templates read the first (transformers' aliasing).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _alias_reasoning(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in chat:
        reasoning = next(
            (message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _plain(value: Any) -> Any:
    """``value`` rebuilt from str, int, float, bool, None, dicts, lists and tuples; anything
    else becomes an inert "<TypeName>" placeholder (transformers' ``_plain_template_data``)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        # np.bool_(False) would otherwise become a truthy placeholder string.
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump())
    return f"<{type(value).__name__}>"


@functools.cache
def _environment() -> Any:
    """The jinja2 environment transformers renders chat templates in (one per process)."""
    import jinja2
    import jinja2.ext
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        # Jinja's own tojson HTML-escapes; templates expect plain JSON.
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        # dict() and dict.fromkeys() only: no attribute access to the type itself.
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # A namespace refusing underscore names, so no template reaches CPython internals.
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes ({name!r})"
                )

    class Generation(jinja2.ext.Extension):
        # transformers' {% generation %} marks assistant text for training masks; rendering
        # only needs its body.
        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a plain attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Any) -> str:
            return str(caller())

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env
