"""``ferry compress``: the recipe, the stages chained and measured, the refusal, the CLI.

The acceptance case: the digits CNN pruned by half (channels removed) and distilled from the
original on UNLABELED training digits ends within 1 point of the original's accuracy on the 360
real held-out test digits, with its MACs at most half the original's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import ferry
from ferry.errors import InvalidInputError
from ferry.optimizer import Stage, compress, parse

pytestmark = pytest.mark.torch


# --------------------------------------------------------------------------------------------
# The recipe


def test_the_issue_recipe_parses() -> None:
    assert parse("prune:channel=0.3,distill:epochs=5,quantize:int8") == [
        Stage("prune", {"method": "channel", "sparsity": 0.3}),
        Stage("distill", {"epochs": 5}),
        Stage("quantize", {"precision": "int8"}),
    ]


def test_options_spelt_several_ways() -> None:
    stages = parse(
        "prune:2:4:exclude=conv1+conv2, distill:epochs=2:lr=0.0005:batch-size=8,"
        "quantize:fp16:budget=2%:dynamic"
    )
    assert stages[0] == Stage("prune", {"method": "2:4", "exclude": ("conv1", "conv2")})
    assert stages[1] == Stage("distill", {"epochs": 2, "lr": 0.0005, "batch_size": 8})
    assert stages[2] == Stage("quantize", {"precision": "fp16", "budget": "2%", "dynamic": True})
    assert str(stages[1]) == "distill:epochs=2:lr=0.0005:batch_size=8"


@pytest.mark.parametrize(
    ("recipe", "words"),
    [
        ("", "empty"),
        ("shrink:0.5", "unknown recipe stage 'shrink'"),
        ("prune:chanel=0.3", "unknown option 'chanel=0.3' for the prune stage"),
        ("quantize:int4", "a precision (int8, fp16, bf16)"),
        ("distill:epochs=many", "distill:epochs takes an integer"),
        ("prune:channel=half", "prune:sparsity takes a number"),
    ],
)
def test_a_bad_recipe_says_what_is_wrong(recipe: str, words: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse(recipe)
    assert words in str(caught.value)


# --------------------------------------------------------------------------------------------
# The chain on real digits


def _digits() -> tuple[Any, list[dict[str, np.ndarray]], str]:
    from ferry import zoo
    from ferry.zoo._specs import get_spec

    model = zoo.build("digits_cnn")
    name = get_spec("digits_cnn").input_name
    x_train, _, _, _ = zoo.digits_data()
    # Unlabeled: the training images alone, one sample per feed.
    feeds = [{name: x_train[i : i + 1]} for i in range(len(x_train))]
    return model, feeds, name


def _accuracy(model: Any) -> float:
    from ferry import zoo

    session = ferry.load(model)
    return zoo.digits_accuracy(lambda feeds: session.run(feeds), batch_size=1)


@pytest.mark.slow
def test_digits_half_the_channels_then_distilled_within_one_point() -> None:
    model, feeds, _ = _digits()
    result = compress(
        model,
        recipe="prune:channel=0.5:multiple=1,distill:epochs=12:lr=0.003",
        data=feeds,
        metric="top1",
        budget="3%",
    )
    original, pruned, distilled = result.report.rows
    assert [r.stage for r in result.report.rows] == [
        "original",
        "prune:method=channel:sparsity=0.5:multiple=1",
        "distill:epochs=12:lr=0.003",
    ]
    assert original.macs and pruned.macs and distilled.macs
    # Both convolutions halved: the second's MACs fall to a quarter.
    assert pruned.macs <= 0.3 * original.macs
    assert distilled.bytes < 0.6 * original.bytes
    # Distillation wins back what pruning lost, on the held-back quarter...
    assert distilled.score >= pruned.score
    assert result.accepted, result.report.refused
    # ... and on the real held-out digits, with their labels.
    before, after = _accuracy(model), _accuracy(result.model)
    assert after >= before - 0.01, (before, after)


def test_over_budget_is_refused_and_nothing_written(tmp_path: Path) -> None:
    model, feeds, _ = _digits()
    out = tmp_path / "small.onnx"
    result = compress(
        model,
        recipe="prune:channel=0.95:multiple=1",
        data=feeds[:200],
        metric="top1",
        budget="0.1%",
    )
    assert not result.accepted
    assert "under" in (result.report.refused or "")
    assert result.model is not None and not out.exists()
    assert result.report.rows[-1].score < 0.999


def test_cli_writes_the_model_and_the_report(tmp_path: Path) -> None:
    from ferry import zoo
    from ferry.cli.main import cli
    from ferry.zoo._specs import get_spec

    name = get_spec("digits_cnn").input_name
    source = zoo.save("digits_cnn", tmp_path)
    x_train, _, _, _ = zoo.digits_data()
    data = tmp_path / "digits.npz"
    np.savez(data, **{name: x_train[:300]})
    out = tmp_path / "small.onnx"
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "compress",
            str(source),
            "-o",
            str(out),
            "--data",
            str(data),
            "--recipe",
            "prune:channel=0.5,distill:epochs=3",
            "--metric",
            "top1",
            "--budget",
            "10%",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "prune:method=channel:sparsity=0.5" in result.output
    report = json.loads(out.with_suffix(".compress.json").read_text())
    assert [r["stage"] for r in report["rows"]][:2] == [
        "original",
        "prune:method=channel:sparsity=0.5",
    ]
    assert ferry.load(out).run({name: x_train[:1]})

    bad = runner.invoke(
        cli, ["compress", str(source), "-o", str(out), "--data", str(data), "--recipe", "zip"]
    )
    assert bad.exit_code == 2
    assert "unknown recipe stage 'zip'" in bad.output
    assert "Traceback" not in bad.output


def test_cli_refusal_exits_3_and_writes_nothing(tmp_path: Path) -> None:
    from ferry import zoo
    from ferry.cli.main import cli
    from ferry.zoo._specs import get_spec

    name = get_spec("digits_cnn").input_name
    source = zoo.save("digits_cnn", tmp_path)
    x_train, _, _, _ = zoo.digits_data()
    data = tmp_path / "digits.npz"
    np.savez(data, **{name: x_train[:200]})
    out = tmp_path / "small.onnx"
    result = CliRunner().invoke(
        cli,
        [
            "compress", str(source), "-o", str(out), "--data", str(data),
            "--recipe", "prune:channel=0.95:multiple=1", "--metric", "top1", "--budget", "0.1%",
        ],
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert "not written" in result.output
    assert not out.exists() and not out.with_suffix(".compress.json").exists()
