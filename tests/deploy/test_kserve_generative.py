"""``ferry deploy kserve`` on a generative artifact (issue 30): the predictor runs ``ferry serve``
with the generation flags, KServe scales it on requests in flight, a request may stream longer
than Knative's default, the memory counts the KV cache, the image installs the ``generate`` extra,
the README says the OpenAI routes; the manifest round-trips through the KServe SDK (when
``FERRY_KSERVE_PYTHON`` names it); bad settings are one line; and (slow) the predictor's command,
run here, answers chat completions with the greedy tokens ``DecoderSession`` gives.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("starlette")

import _kserve_helpers as kh
import _serving_models as models

from ferry.cli.main import cli
from ferry.deploy import kserve_manifests
from ferry.errors import InvalidInputError

MESSAGES = [{"role": "user", "content": "Say hi"}]
SETTINGS: dict[str, Any] = {"max_num_seqs": 4, "max_model_len": 48, "max_queue": 8}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama decoder artifact (context 64), served as ``tiny``."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "generate"))  # its helpers' imports
    from tests.generate.test_artifact import tiny_config, tiny_model, write_tiny

    folder = tmp_path_factory.mktemp("kserve-gen") / "tiny"
    return write_tiny(folder, model=tiny_model(tiny_config(), "ort"))


@pytest.fixture(scope="module")
def written(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The artifact written with the generation settings, and a repository holding it beside a
    tensor model (its KV budget given)."""
    out = tmp_path_factory.mktemp("kserve-gen-out")
    repo = out / "repo"
    models.write_model(repo, "add", 1, models.add_const(1))
    shutil.copytree(artifact, repo / "chat" / "1")
    return {
        "artifact": kserve_manifests(artifact, out / "artifact", wheel=False, **SETTINGS),
        "repo": kserve_manifests(repo, out / "repository", wheel=False, kv_cache_mib=64),
    }


def test_the_predictor_serves_it_with_the_generation_flags(written: dict[str, Any]) -> None:
    deployment = written["artifact"]
    manifest = kh.load_manifest(deployment.out_dir)
    predictor = manifest["spec"]["predictor"]
    container = kh.container_of(manifest)
    argv = [*container["command"], *container["args"]]
    assert argv == [
        "ferry", "serve", "/mnt/models/tiny", "--host", "0.0.0.0", "--port", "8080",
        "--drain-timeout", "25", "--max-num-seqs", "4", "--max-model-len", "48",
        "--max-queue", "8",
    ]  # fmt: skip
    assert argv == list(deployment.command)
    # as for every model: KServe's port, the v2 protocol, the probes
    assert container["ports"] == [{"name": "http1", "containerPort": 8080, "protocol": "TCP"}]
    assert {"name": "PROTOCOL", "value": "v2"} in container["env"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    # an LLM's: scaled on requests in flight (a pod's batch), long streams allowed
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("concurrency", 4)
    assert predictor["timeout"] == 900
    assert deployment.generative_models == ("tiny",)
    marker = json.loads((deployment.out_dir / "ferry-kserve.json").read_text())
    assert marker["generative_models"] == ["tiny"]
    assert any(line.startswith("OpenAI API at $URL/v1 for tiny") for line in deployment.lines())


def test_memory_counts_the_weights_and_the_kv_cache(
    written: dict[str, Any], artifact: Path
) -> None:
    size = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file()) / 2**20
    # tiny_config: 2 layers, 2 KV heads of 8, fp32: keys and values, 256 bytes a token
    kv = 4 * 48 * (2 * 2 * 2 * 8 * 4) / 2**20
    want = f"{math.ceil((1024 + 2 * size + kv) / 256) * 256}Mi"
    resources = kh.container_of(kh.load_manifest(written["artifact"].out_dir))["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == want
    # a repository: its models' sizes three times (a tensor model beside), the KV budget given
    repo = written["repo"]
    memory = kh.container_of(kh.load_manifest(repo.out_dir))["resources"]["requests"]["memory"]
    files = [p for p in (repo.out_dir / "model").rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files) / 2**20
    assert memory == f"{math.ceil((1024 + 3 * total + 64) / 256) * 256}Mi"


def test_a_repository_with_a_generative_model(written: dict[str, Any]) -> None:
    deployment = written["repo"]
    assert deployment.served_models == ("add", "chat")
    assert deployment.generative_models == ("chat",)
    manifest = kh.load_manifest(deployment.out_dir)
    args = kh.container_of(manifest)["args"]
    assert args[args.index("--max-num-seqs") + 1] == "16"
    assert args[args.index("--kv-cache-mib") + 1] == "64"
    assert "--max-model-len" not in args  # the model's own context
    assert manifest["spec"]["predictor"]["scaleTarget"] == 16


def test_the_image_and_the_readme(written: dict[str, Any]) -> None:
    out = written["artifact"].out_dir
    dockerfile = (out / "Dockerfile").read_text()
    assert "[serve,generate]" in dockerfile  # the tokenizer and the chat template
    readme = (out / "README.txt").read_text()
    assert "curl -X POST $URL/v1/chat/completions" in readme
    assert '"model": "tiny"' in readme and "$URL/v2/models/tiny/generate" in readme
    assert "base_url=$URL/v1" in readme
    assert "/v2/models/tiny/infer" not in readme  # /infer refuses a generative model
    # a tensor model's README stays as it was: no OpenAI lines
    assert "/v2/models/add/infer" in (written["repo"].out_dir / "README.txt").read_text()


def test_the_manifests_round_trip_through_the_kserve_sdk(written: dict[str, Any]) -> None:
    paths = [d.manifest_path for d in written.values()]
    answers = kh.validate_with_sdk(paths)
    for path in paths:
        (result,) = answers[str(path)]["results"]
        assert "error" not in result, result.get("error")
        assert result["differences"] == [] and result["equal"] is True


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_num_seqs": 0}, r"max_num_seqs must be an integer >= 1"),
        ({"max_queue": 0}, r"max_queue must be an integer >= 1"),
        ({"kv_cache_mib": -1}, r"kv_cache_mib must be > 0"),
        ({"max_model_len": 65}, r"over model 'tiny''s context \(64 tokens\)"),
        ({"protocol": "grpc"}, r"tiny is generative, answered by the OpenAI API over HTTP"),
        ({"protocol": "h2"}, r"--protocol 'h2': choose http"),
    ],
)
def test_bad_settings_are_refused_before_anything_is_written(
    artifact: Path, tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        kserve_manifests(artifact, tmp_path / "out", wheel=False, **kwargs)
    assert not (tmp_path / "out").exists()


def test_cli_writes_it_and_says_bad_flags_in_one_line(artifact: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["deploy", "kserve", str(artifact), "-o", str(out), "--no-wheel"]
    done = CliRunner().invoke(cli, [*args, "--max-num-seqs", "2", "--kv-cache-mib", "8"])
    assert done.exit_code == 0, done.output
    assert "--max-num-seqs 2" in done.output and "--kv-cache-mib 8 " in done.output
    assert "OpenAI API at $URL/v1 for tiny" in done.output
    for flags, message in [
        (["--max-model-len", "100"], "--max-model-len 64 or less"),
        (["--max-queue", "0"], "--max-queue"),
    ]:
        done = CliRunner().invoke(cli, [*args, "--force", *flags])
        assert done.exit_code == 2, done.output
        assert message in done.output and "Traceback" not in done.output
        assert len(done.output.strip().splitlines()) == 1, done.output


@pytest.mark.slow
def test_the_predictor_command_answers_chat_completions(
    written: dict[str, Any], artifact: Path, tmp_path: Path
) -> None:
    from ferry.generate import DecoderSession

    want = DecoderSession.from_folder(artifact).generate(messages=MESSAGES, max_new_tokens=8)
    deployment = written["artifact"]
    with kh.serve_manifest(deployment.out_dir, tmp_path) as host:
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
        request = urllib.request.Request(
            f"http://{host}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    assert answer["choices"][0]["message"]["content"] == want.text
