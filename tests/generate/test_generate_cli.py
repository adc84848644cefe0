"""``ferry generate`` on the tiny decoder of test_loop (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import onnx
import pytest
from click.testing import CliRunner, Result
from tests.generate.test_loop import (
    PROMPT,
    PROMPT_IDS,
    _Template,
    byte_tokenizer,
    expected,
    tiny_decoder,
)

import ferry
from ferry.cli._generate import command
from ferry.cli.main import FerryGroup
from ferry.generate._loop import DecoderSession

#: The keywords the command loaded the artifact with.
LOAD_OPTIONS: dict[str, Any] = {}


@pytest.fixture
def artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    onnx.save(tiny_decoder(context=48), folder / "model.onnx")
    (folder / "ferry.json").write_text(json.dumps({"generative": {"config": {}}}))
    LOAD_OPTIONS.clear()

    def from_folder(cls: type, where: Path, **load_options: Any) -> DecoderSession:
        # The artifact's tokenizer files are the artifact module's to read; the loop and the
        # command are what is tested here.
        LOAD_OPTIONS.update(load_options)
        session = ferry.load(Path(where) / "model.onnx", **load_options)
        return DecoderSession(session, byte_tokenizer(), _Template(), {"eos_token_id": []})

    monkeypatch.setattr(DecoderSession, "from_folder", classmethod(from_folder))
    return folder


@click.group(cls=FerryGroup)
def cli() -> None:
    """The command under ferry's own group (its error lines and exit codes): ``ferry.cli.main``
    registers it once the README's tour shows it (tests/unit/test_docs.py asks that)."""


cli.add_command(command)


def generate(*args: str) -> Result:
    return CliRunner().invoke(cli, ["generate", *args], prog_name="ferry")


def test_streams_the_text_and_reports(artifact: Path) -> None:
    result = generate(str(artifact), "--prompt", PROMPT, "--max-new-tokens", "8", "--threads", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout == byte_tokenizer().decode(expected(PROMPT_IDS, 8)) + "\n"
    assert "finish: length, 5 prompt tokens, 8 new tokens" in result.stderr
    assert "tokens/s" in result.stderr
    assert LOAD_OPTIONS["threads"] == 1


def test_chat_with_a_system_message(artifact: Path) -> None:
    result = generate(
        str(artifact), "--prompt", "hi", "--system", "be brief", "--max-new-tokens", "3"
    )
    assert result.exit_code == 0, result.output
    prompt = list(b"<system>be brief<user>hi<assistant>")
    assert result.stdout.rstrip("\n") == byte_tokenizer().decode(expected(prompt, 3))


def test_stop_text(artifact: Path) -> None:
    full = byte_tokenizer().decode(expected(PROMPT_IDS, 20))
    stop = full[6:8]
    result = generate(str(artifact), "--prompt", PROMPT, "--max-new-tokens", "20", "--stop", stop)
    assert result.exit_code == 0, result.output
    assert result.stdout == full[: full.find(stop)] + "\n"
    assert "finish: stop" in result.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--temperature", "-1"], "temperature=-1.0 is out of range"),
        (["--top-p", "2"], "top_p"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--prompt", "x" * 60], "the prompt is 60 tokens; the context is 48"),
    ],
)
def test_bad_input_is_one_error_line(artifact: Path, args: list[str], said: str) -> None:
    result = generate(str(artifact), "--prompt", PROMPT, *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], lines


def test_a_plain_model_folder_is_refused(tmp_path: Path) -> None:
    model = tiny_decoder()
    del model.metadata_props[:]
    onnx.save(model, tmp_path / "model.onnx")
    result = generate(str(tmp_path), "--prompt", PROMPT)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "not a generative artifact" in result.stderr


def test_help_has_examples() -> None:
    result = generate("--help")
    assert result.exit_code == 0
    assert (
        "ferry generate smollm/ --chat" in result.output and "--repetition-penalty" in result.output
    )


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """A whole artifact folder as ferry convert writes it, around the tiny decoder."""
    import onnx_ir as ir

    from ferry.generate._artifact import generation_config_for, write_decoder_artifact
    from ferry.generate._template import ChatTemplate

    config = {"context_length": 48, "eos_ids": [256]}
    source = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return write_decoder_artifact(
        tmp_path / "tiny",
        model=ir.from_proto(tiny_decoder(context=48)),
        config=config,
        tokenizer=byte_tokenizer(),
        template=ChatTemplate(source, bos_token=None, eos_token="<|eos|>"),
        generation_config=generation_config_for(config),
    )


def _until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(256) + 1] if 256 in ids else ids


def test_a_written_artifact_through_load_and_the_command(written: Path) -> None:
    decoder = ferry.load(written)
    assert isinstance(decoder, DecoderSession) and decoder.context_length == 48
    gen = decoder.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=6)
    prompt = list(b"<user>hi<assistant>")
    assert gen.ids == _until_eos(expected(prompt, 6))
    result = generate(str(written), "--chat", "--prompt", "hi", "--max-new-tokens", "6")
    assert result.exit_code == 0, result.output
    assert result.stdout == gen.text + "\n"
    assert f"{len(prompt)} prompt tokens, {len(gen.ids)} new tokens" in result.stderr


def test_a_missing_tokenizer_is_one_error_line(written: Path) -> None:
    (written / "tokenizer.json").unlink()
    result = generate(str(written), "--prompt", PROMPT)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "tokenizer.json" in lines[0]


def test_load_refuses_options_a_decoder_cannot_use(written: Path) -> None:
    """ferry.load on a generative folder never drops a one-forward option silently."""
    keywords: list[dict[str, Any]] = [{"optimize": True}, {"shapes": {"input_ids": [1, 4]}}]
    for keyword in keywords:
        with pytest.raises(ferry.InvalidInputError, match="generative decoder"):
            ferry.load(written, **keyword)
