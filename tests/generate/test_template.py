"""Chat templates rendered as transformers' apply_chat_template renders them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_tokenizer import KIT_GGUF, gguf_metadata, kit_chats

from ferry.errors import InvalidInputError
from ferry.generate._template import ChatTemplate
from ferry.generate._tokenizer import special_token


@pytest.fixture(scope="module")
def smollm() -> tuple[ChatTemplate, Any]:
    """(our template, transformers' tokenizer) for the kit's SmolLM2 GGUF."""
    if not KIT_GGUF.is_file():
        pytest.skip(f"the kit's SmolLM2 GGUF is not at {KIT_GGUF} (scripts/fetch-kit.sh)")
    transformers = pytest.importorskip("transformers")
    metadata = gguf_metadata(KIT_GGUF)
    template = ChatTemplate(
        metadata["tokenizer.chat_template"],
        bos_token=special_token(metadata, "bos"),
        eos_token=special_token(metadata, "eos"),
    )
    reference = transformers.AutoTokenizer.from_pretrained(
        str(KIT_GGUF.parent), gguf_file=KIT_GGUF.name
    )
    return template, reference


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("system", [None, "You are a pirate. Answer like one."])
def test_kit_chats_render_as_transformers(
    smollm: tuple[ChatTemplate, Any], system: str | None, generation_prompt: bool
) -> None:
    template, reference = smollm
    for chat in kit_chats():
        if system is not None:
            chat = [
                {"role": "system", "content": system},
                *[m for m in chat if m["role"] != "system"],
            ]
        ours = template.render(chat, add_generation_prompt=generation_prompt)
        theirs = reference.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=generation_prompt
        )
        assert ours == theirs


def test_default_system_prompt_and_generation_header(smollm: tuple[ChatTemplate, Any]) -> None:
    template, _ = smollm
    text = template.render([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


# The features of transformers' environment, each in a small template compared with transformers.
FEATURES = {
    "tojson": "{{ messages | tojson }}{{ {'b': 1, 'a': '<é>'} | tojson(indent=2, sort_keys=true) }}",
    "loopcontrols": "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
    "{{ m.content }}{% endfor %}",
    "trim": "{% for m in messages %}\n    {{ m.role }}: {{ m.content }}\n{% endfor %}",
    "tokens": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ custom }}",
    "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% endfor %}{{ ns.n }}{{ dict(a=1) | tojson }}",
    "generation": "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}"
    "{% endfor %}{% if add_generation_prompt %}>{% endif %}",
    "reasoning": "{% for m in messages %}{{ m.reasoning_content }}|{{ m.thinking }}{% endfor %}",
    "none_dropped": "{% for m in messages %}{{ 'tool_calls' in m }}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_environment_features_as_transformers(smollm: tuple[ChatTemplate, Any], name: str) -> None:
    _, reference = smollm
    source = FEATURES[name]
    chat: list[dict[str, Any]] = [
        {"role": "user", "content": 'Say "hi" <b>&</b>', "tool_calls": None},
        {"role": "assistant", "content": "hi", "reasoning": "they asked"},
    ]
    ours = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(chat, custom="!")
    theirs = reference.apply_chat_template(
        chat, chat_template=source, tokenize=False, add_generation_prompt=True,
        bos_token="<s>", eos_token="</s>", custom="!",
    )  # fmt: skip
    assert ours == theirs


def test_tojson_does_not_escape_html() -> None:
    text = ChatTemplate("{{ messages[0] | tojson }}", bos_token=None, eos_token=None).render(
        [{"role": "user", "content": "<a href='x'>&</a>"}]
    )
    assert json.loads(text)["content"] == "<a href='x'>&</a>"
    assert "<a href='x'>&</a>" in text


def test_strftime_now() -> None:
    import datetime

    text = ChatTemplate("{{ strftime_now('%Y') }}", bos_token=None, eos_token=None).render(
        [{"role": "user", "content": "x"}]
    )
    assert text == str(datetime.datetime.now().year)


def test_raise_exception_is_one_ferry_error() -> None:
    source = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start "
        "with a user message') }}{% endif %}{{ messages[0].content }}"
    )
    template = ChatTemplate(source, bos_token=None, eos_token=None)
    assert template.render([{"role": "user", "content": "ok"}]) == "ok"
    with pytest.raises(InvalidInputError, match="chat template failed: Conversations must start"):
        template.render([{"role": "assistant", "content": "no"}])


def test_template_errors_are_ferry_errors() -> None:
    with pytest.raises(InvalidInputError, match="does not parse.*line 1"):
        ChatTemplate("{% for m in messages %}", bos_token=None, eos_token=None)
    template = ChatTemplate("{{ messages[0].content.upper() }}", bos_token=None, eos_token=None)
    with pytest.raises(InvalidInputError, match="at least one message"):
        template.render([])
    with pytest.raises(InvalidInputError, match="dict"):
        template.render(["hello"])  # type: ignore[list-item]
    # The sandbox refuses what a template must not do (mutating its inputs), as one clear error.
    mutating = ChatTemplate("{{ messages.append(1) }}", bos_token=None, eos_token=None)
    with pytest.raises(InvalidInputError, match="chat template failed"):
        mutating.render([{"role": "user", "content": "x"}])
