"""``ferry deploy kserve``: the InferenceService, its predictor image build and README.

No Kubernetes runs here, so the manifests are checked three ways:

- by the KServe Python SDK's own types (``kserve`` 0.21, in its own environment: see
  ``_kserve_validate.py``): every manifest deserializes into ``V1beta1InferenceService`` and
  serializes back to the very dict written (nothing dropped, nothing retyped), and the predictor
  the SDK's objects hold has the command, probes, ports, resources and replicas asked for;
- by running the predictor container's command here: it is the ``ferry serve`` the serving
  tests cover, on the model copied into the build context (what the image holds at
  /mnt/models), answering its readiness and liveness probes, inferences by Triton's client equal
  to ONNX Runtime's, and exiting 0 at SIGTERM;
- by reading the Dockerfile: its CMD is the manifest's command, what it copies exists, the wheel
  is ferry's.

The CLI's bad inputs are one line and exit 2, the output folder is written atomically, and the
user's model is never changed.
"""

from __future__ import annotations

import copy
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("starlette")
pytest.importorskip("tritonclient.http")

import _kserve_helpers as kh
import _serving_models as models

import ferry.deploy._kserve as kserve_module
from ferry import __version__
from ferry.cli.main import cli
from ferry.deploy import build_wheel, kserve_manifests

RNG = np.random.default_rng(3)


# ---------------------------------------------------------------------------------------------
# models: a plain file, a file with external data in a subfolder, an artifact, a repository


def mlp() -> onnx.ModelProto:
    """x[batch, 8] -> MatMul(W[8, 4]) + b -> Relu -> y[batch, 4]."""
    w = numpy_helper.from_array(RNG.standard_normal((8, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "b"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["y"], name="relu"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save_external(model: onnx.ModelProto, path: Path, location: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=0,
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    adder = root / "Adder_Model.onnx"
    onnx.save(models.add_const(1.5), adder)
    external = root / "ext" / "mlp.onnx"
    save_external(mlp(), external, "weights/mlp.bin")
    artifact = root / "digits_art"
    artifact.mkdir()
    onnx.save(models.add_const(-2.0), artifact / "model.onnx")
    (artifact / "ferry.json").write_text(json.dumps({"format": "test"}))
    repo = root / "repo"
    models.write_model(repo, "adder", 1, models.add_const(3.0))
    save_external(mlp(), repo / "mlp" / "2" / "model.onnx", "model.onnx.data")
    models.write_config(repo, "mlp", {"max_batch_size": 4})
    return {"file": adder, "external": external, "artifact": artifact, "repo": repo}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ferry's wheel, built once from this checkout."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


#: The variants written once and checked by every test below: (source, options).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "file": ("file", {"wheel": True}),
    "external": (
        "external",
        {
            "name": "mlp-ext",
            "namespace": "ml",
            "api_key_secret": "mlp-key:token",
            "cpu": "500m,2",
            "memory": "1Gi,2Gi",
            "autoscale": "0,3",
            "backends": "openvino,onnxruntime",
            "precision": "fp32",
            "optimize": "basic",
        },
    ),
    "artifact": ("artifact", {"replicas": 2, "image": "ghcr.io/acme/digits:1"}),
    "repo": ("repo", {"autoscale": (1, 4)}),
    "gpu": ("file", {"name": "trt", "gpu": 1, "backends": "tensorrt,onnxruntime", "cpu": "4"}),
    "storage": ("file", {"storage_uri": "s3://bucket/models", "wheel": False}),
    "grpc": ("file", {"name": "adder-grpc", "protocol": "grpc"}),
}


@pytest.fixture(scope="module")
def written(
    sources: dict[str, Path], wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Every variant written; the sources' hashes before and after."""
    out = tmp_path_factory.mktemp("manifests")
    before = {k: kh.tree_hash(p) for k, p in sources.items()}
    done = {}
    for variant, (source, options) in VARIANTS.items():
        options = {"wheel": wheel, **options}
        done[variant] = kserve_manifests(sources[source], out / variant, **options)
    after = {k: kh.tree_hash(p) for k, p in sources.items()}
    return {"deployments": done, "before": before, "after": after, "root": out}


@pytest.fixture(scope="module")
def sdk(written: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The KServe SDK's reading of every variant's manifest (one subprocess for all)."""
    paths = {v: d.manifest_path for v, d in written["deployments"].items()}
    answers = kh.validate_with_sdk(list(paths.values()))
    return {v: answers[str(p)] for v, p in paths.items()}


# ---------------------------------------------------------------------------------------------
# the KServe SDK's types


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_manifest_round_trips_through_the_kserve_sdk(
    variant: str, sdk: dict[str, dict[str, Any]], written: dict[str, Any]
) -> None:
    answer = sdk[variant]
    assert answer["documents"] == 1
    (result,) = answer["results"]
    assert "error" not in result, result.get("error")
    assert result["differences"] == []
    assert result["equal"] is True
    manifest = kh.load_manifest(written["deployments"][variant].out_dir)
    assert manifest["apiVersion"] == answer["api_version_expected"] == "serving.kserve.io/v1beta1"
    assert manifest["kind"] == answer["kind_expected"] == "InferenceService"
    assert result["predictor"]["type"] == "V1beta1InferenceService"
    assert result["predictor"]["container_type"] == "V1Container"


def test_the_validator_refuses_what_kserve_would_not_keep(
    written: dict[str, Any], tmp_path: Path
) -> None:
    """The round trip bites: a field KServe's types lack is dropped (KServe's
    ``protocolVersion`` is no custom predictor field: PROTOCOL=v2 is), a string where an
    integer goes is refused, a container without a name too."""
    manifest = kh.load_manifest(written["deployments"]["file"].out_dir)
    broken: dict[str, dict[str, Any]] = {}
    broken["protocol"] = copy.deepcopy(manifest)
    broken["protocol"]["spec"]["predictor"]["protocolVersion"] = "v2"
    broken["port"] = copy.deepcopy(manifest)
    broken["port"]["spec"]["predictor"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    broken["name"] = copy.deepcopy(manifest)
    del broken["name"]["spec"]["predictor"]["containers"][0]["name"]
    broken["replicas"] = copy.deepcopy(manifest)
    broken["replicas"]["spec"]["predictor"]["minReplicas"] = "1"
    paths = {}
    for key, doc in broken.items():
        paths[key] = tmp_path / f"{key}.yaml"
        paths[key].write_text(yaml.safe_dump(doc))
    answers = kh.validate_with_sdk(list(paths.values()))
    results = {k: answers[str(p)]["results"][0] for k, p in paths.items()}
    assert results["protocol"]["differences"] == [".spec.predictor.protocolVersion: dropped"]
    assert "containerPort" in results["port"]["error"]
    assert "name" in results["name"]["error"]
    assert results["replicas"]["equal"] is False


def _args(variant: str, written: dict[str, Any]) -> list[str]:
    return list(written["deployments"][variant].command)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_predictor_as_the_sdk_reads_it(
    variant: str, sdk: dict[str, dict[str, Any]], written: dict[str, Any]
) -> None:
    deployment = written["deployments"][variant]
    view = sdk[variant]["results"][0]["predictor"]
    options = VARIANTS[variant][1]
    assert view["containers"] == 1
    assert view["container"] == "kserve-container"
    assert view["command"] == ["ferry", "serve"]
    assert view["args"][:7] == [
        deployment.model_path,
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "--drain-timeout",
        "25",
    ]
    assert [*view["command"], *view["args"]] == list(deployment.command)
    assert deployment.model_path.startswith("/mnt/models/")
    assert view["env"]["PROTOCOL"] == "v2"
    ready, live = view["readiness"], view["liveness"]
    if variant == "grpc":
        # KServe routes the one port named h2c; Knative probes that port: gRPC's health check.
        assert view["ports"] == [{"name": "h2c", "container_port": 8081, "protocol": "TCP"}]
        assert (ready["grpc"], live["grpc"]) == ([8081, "ready"], [8081, "live"])
        assert view["args"][7:] == ["--grpc-port", "8081"]
    else:
        assert view["ports"] == [{"name": "http1", "container_port": 8080, "protocol": "TCP"}]
        assert (ready["path"], ready["port"]) == ("/v2/health/ready", 8080)
        assert (live["path"], live["port"]) == ("/v2/health/live", 8080)
    # A loading model must never get the pod restarted: a minute or more without an answer.
    grace = live["initial_delay_seconds"] + live["period_seconds"] * live["failure_threshold"]
    assert grace >= 60
    assert ready["period_seconds"] <= live["period_seconds"]
    assert view["run_as_non_root"] is True
    assert view["image"] == deployment.image
    if "image" in options:
        assert view["image"] == options["image"]
    else:
        assert re.fullmatch(
            rf"dev\.local/ferry-{deployment.name}:{re.escape(__version__)}-[0-9a-f]{{12}}",
            view["image"],
        )
    assert view["name"] == options.get("name", deployment.name)
    assert view["namespace"] == options.get("namespace")
    if variant == "external":
        assert view["env"]["FERRY_API_KEY"] == {"secret": "mlp-key", "key": "token"}
        assert view["requests"] == {"cpu": "500m", "memory": "1Gi"}
        assert view["limits"] == {"cpu": "2", "memory": "2Gi"}
        assert (view["min_replicas"], view["max_replicas"]) == (0, 3)
        assert view["args"][7:] == [
            "--backends",
            "openvino,onnxruntime",
            "--precision",
            "fp32",
            "--optimize",
            "basic",
        ]
    else:
        assert "FERRY_API_KEY" not in view["env"]
    if variant == "artifact":
        assert (view["min_replicas"], view["max_replicas"]) == (2, 2)
    if variant == "repo":
        assert (view["min_replicas"], view["max_replicas"]) == (1, 4)
    if variant in ("file", "storage", "artifact", "repo"):
        # The default: one CPU and 1 GiB + 3x the model (rounded up to 256 MiB), request = limit.
        assert view["requests"] == view["limits"] == {"cpu": "1", "memory": "1280Mi"}
        assert view["args"][7:] == []
    if variant == "gpu":
        assert view["limits"] == {"cpu": "4", "memory": "1280Mi", "nvidia.com/gpu": "1"}
        assert "nvidia.com/gpu" not in view["requests"]
    if variant == "storage":
        assert view["env"]["STORAGE_URI"] == "s3://bucket/models"
    else:
        assert "STORAGE_URI" not in view["env"]


def test_model_paths_keep_the_model_names(written: dict[str, Any]) -> None:
    """In the container the model is /mnt/models/<its own name>: ferry serve names it as here."""
    d = written["deployments"]
    assert d["file"].model_path == "/mnt/models/Adder_Model.onnx"
    assert d["file"].served_models == ("Adder_Model",)
    assert d["file"].name == "adder-model"
    assert d["external"].model_path == "/mnt/models/mlp.onnx"
    assert d["artifact"].model_path == "/mnt/models/digits_art"
    assert d["artifact"].served_models == ("digits_art",)
    assert d["artifact"].name == "digits-art"
    assert d["repo"].model_path == "/mnt/models/repo"
    assert d["repo"].served_models == ("adder", "mlp")


def test_the_users_models_are_unchanged(written: dict[str, Any]) -> None:
    assert written["after"] == written["before"]


# ---------------------------------------------------------------------------------------------
# the predictor command is ferry serve: run it here


def _check_served(
    host: str, model: str, source: Path, headers: dict[str, str] | None = None
) -> None:
    import onnxruntime as ort

    (spec,) = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).get_inputs()
    shape = [d if isinstance(d, int) else 2 for d in spec.shape]
    feeds = {spec.name: RNG.standard_normal(shape).astype(np.float32)}
    got = kh.infer(host, model, feeds, headers=headers)
    want = kh.onnxruntime_outputs(source, feeds)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_predictor_command_serves_a_model_file(
    written: dict[str, Any], sources: dict[str, Path], tmp_path: Path
) -> None:
    deployment = written["deployments"]["file"]
    with kh.serve_manifest(deployment.out_dir, tmp_path) as host:
        _check_served(host, "Adder_Model", sources["file"])
        assert kh.get(f"http://{host}/v2/health/live") == 200


@pytest.mark.slow
def test_predictor_command_serves_grpc_with_its_health_probes(
    written: dict[str, Any], sources: dict[str, Path], tmp_path: Path
) -> None:
    """--protocol grpc: the pod's routed port answers Triton's gRPC inference and the health
    checks its probes make."""
    import grpc
    import tritonclient.grpc as tgrpc

    deployment = written["deployments"]["grpc"]
    port = kh.free_port()
    with kh.serve_manifest(deployment.out_dir, tmp_path, grpc_port=port):
        probes = kh.container_of(kh.load_manifest(deployment.out_dir))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            for probe in ("readinessProbe", "livenessProbe"):
                service = probes[probe]["grpc"]["service"].encode()
                request = bytes((0x0A, len(service))) + service  # HealthCheckRequest.service
                assert check(request, timeout=10) == b"\x08\x01"  # SERVING
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        model = onnx.load(sources["file"])
        feeds = {
            i.name: RNG.standard_normal(
                [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
            ).astype(np.float32)
            for i in model.graph.input
        }
        inputs = []
        for name, array in feeds.items():
            tensor = tgrpc.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = client.infer("Adder_Model", inputs)
        want = kh.onnxruntime_outputs(sources["file"], feeds)
        for name in want:
            np.testing.assert_allclose(result.as_numpy(name), want[name], rtol=1e-5, atol=1e-6)
        client.close()


@pytest.mark.slow
def test_predictor_command_serves_external_data_with_the_api_key_secret(
    written: dict[str, Any], sources: dict[str, Path], tmp_path: Path
) -> None:
    """The copied model finds its weights (weights/mlp.bin); FERRY_API_KEY from the Secret
    guards inference; OpenVINO runs it as the manifest asks."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    deployment = written["deployments"]["external"]
    key = "s3cret-token"
    with kh.serve_manifest(
        deployment.out_dir, tmp_path, secrets={("mlp-key", "token"): key}
    ) as host:
        _check_served(host, "mlp", sources["external"], {"Authorization": f"Bearer {key}"})
        client = http.InferenceServerClient(host)
        try:
            x = http.InferInput("x", [1, 8], "FP32")
            x.set_data_from_numpy(np.zeros((1, 8), np.float32))
            with pytest.raises(InferenceServerException, match="401|[Uu]nauthori"):
                client.infer("mlp", [x])
        finally:
            client.close()
        assert kh.get(f"http://{host}/v2/health/live") == 200
        assert kh.get(f"http://{host}/v2/health/ready") == 200


@pytest.mark.slow
def test_predictor_command_serves_an_artifact_and_a_repository(
    written: dict[str, Any], sources: dict[str, Path], tmp_path: Path
) -> None:
    with kh.serve_manifest(written["deployments"]["artifact"].out_dir, tmp_path) as host:
        _check_served(host, "digits_art", sources["artifact"] / "model.onnx")
    with kh.serve_manifest(written["deployments"]["repo"].out_dir, tmp_path) as host:
        _check_served(host, "adder", sources["repo"] / "adder" / "1" / "model.onnx")
        _check_served(host, "mlp", sources["repo"] / "mlp" / "2" / "model.onnx")
        assert kh.get(f"http://{host}/v2/health/live") == 200


@pytest.mark.slow
def test_predictor_command_serves_what_the_storage_uri_holds(
    written: dict[str, Any], sources: dict[str, Path], tmp_path: Path
) -> None:
    """With --storage-uri nothing is baked in; KServe downloads the URI to /mnt/models, which
    holds the model under its own name, as README.txt says to upload it."""
    deployment = written["deployments"]["storage"]
    assert not (deployment.out_dir / "model").exists()
    mount = tmp_path / "mnt-models"
    mount.mkdir()
    (mount / sources["file"].name).write_bytes(sources["file"].read_bytes())
    with kh.serve_manifest(deployment.out_dir, tmp_path, mount=mount) as host:
        _check_served(host, "Adder_Model", sources["file"])
    readme = deployment.readme.read_text()
    assert f"aws s3 cp {sources['file']} s3://bucket/models/Adder_Model.onnx" in readme


# ---------------------------------------------------------------------------------------------
# the Dockerfile, the wheel, the README


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dockerfile_runs_the_manifests_command(
    variant: str, written: dict[str, Any], wheel: Path, sources: dict[str, Path]
) -> None:
    deployment = written["deployments"][variant]
    out = deployment.out_dir
    steps = kh.parse_dockerfile(deployment.dockerfile.read_text())
    keywords = [k for k, _ in steps]
    assert steps[0] == ("FROM", "python:3.11-slim")
    assert keywords.count("CMD") == 1
    cmd = json.loads(dict(steps)["CMD"])
    container = kh.container_of(kh.load_manifest(out))
    assert cmd == [*container["command"], *container["args"]] == list(deployment.command)
    assert dict(steps)["EXPOSE"] == ("8080 8081" if variant == "grpc" else "8080")
    user = dict(steps)["USER"]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), user  # numeric, not root
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN")
    copied = []
    for keyword, arguments in steps:
        if keyword in ("COPY", "ADD"):
            assert keyword == "COPY"
            *from_context, _dest = arguments.split()
            copied.extend(from_context)
    no_wheel = VARIANTS[variant][1].get("wheel") is False
    for item in copied:
        if no_wheel and item.startswith("wheels/"):
            # Not built: the README says how; the name is the one a build gives.
            assert item == f"wheels/{wheel.name}"
            assert not (out / item).exists()
            assert "pip wheel --no-deps -w wheels" in deployment.readme.read_text()
            continue
        assert (out / item).exists(), item
    assert f"wheels/{wheel.name}" in copied
    install = next(a for k, a in steps if k == "RUN" and "pip install" in a)
    assert "--constraint /tmp/ferry/constraints.txt" in install
    extras = re.search(rf"/tmp/ferry/{re.escape(wheel.name)}\[([a-z,]+)\]", install)
    assert extras is not None, install
    wanted = {"external": {"serve", "openvino"}, "gpu": {"serve", "tensorrt"}}
    assert set(extras.group(1).split(",")) == wanted.get(variant, {"serve"})
    baked = "storage_uri" not in VARIANTS[variant][1]
    assert ("model/" in copied) is baked
    if baked:
        source = sources[VARIANTS[variant][0]]
        _assert_same_files(source, out / "model", deployment.model_path)


def _assert_same_files(source: Path, context: Path, model_path: str) -> None:
    """The build context's model/ holds the model's files as /mnt/models will, readable by all."""
    in_image = context / model_path.removeprefix("/mnt/models/")
    if source.is_file():
        assert in_image.read_bytes() == source.read_bytes()
        model = onnx.load(source, load_external_data=False)
        locations = {
            entry.value
            for t in model.graph.initializer
            for entry in t.external_data
            if entry.key == "location"
        }
        for location in locations:
            assert (in_image.parent / location).read_bytes() == (
                source.parent / location
            ).read_bytes()
        expected = {source.name, *locations}
        present = {p.relative_to(context).as_posix() for p in context.rglob("*") if p.is_file()}
        assert present == expected
    else:
        want = {p.relative_to(source): p.read_bytes() for p in source.rglob("*") if p.is_file()}
        got = {p.relative_to(in_image): p.read_bytes() for p in in_image.rglob("*") if p.is_file()}
        assert got == want
    for p in context.rglob("*"):
        mode = p.stat().st_mode & 0o777
        assert mode == (0o755 if p.is_dir() else 0o644), (p, oct(mode))


def test_the_wheel_is_ferrys(written: dict[str, Any], wheel: Path) -> None:
    built = written["deployments"]["file"].wheel
    assert built is not None and built.name == wheel.name
    assert wheel.name == f"ferry-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(built) as z:
        names = set(z.namelist())
        meta = z.read(f"ferry-{__version__}.dist-info/METADATA").decode()
        entry_points = z.read(f"ferry-{__version__}.dist-info/entry_points.txt").decode()
    assert {"ferry/__init__.py", "ferry/deploy/_kserve.py", "ferry/web/assets/index.html"} <= names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert "Name: ferry" in meta and f"Version: {__version__}" in meta
    assert "Provides-Extra: serve" in meta
    assert "ferry = ferry.cli.main:main" in entry_points
    assert written["deployments"]["storage"].wheel is None


def test_the_wheel_build_leaves_the_checkout_alone(tmp_path: Path) -> None:
    """setuptools writes build/ and *.egg-info beside the sources: the build copies them first."""
    root = Path(kserve_module.__file__).resolve().parents[3]

    def outputs() -> dict[str, float]:
        found = [root / "build", root / "dist", *root.glob("*.egg-info"), *root.glob("src/*")]
        return {str(p): p.stat().st_mtime for p in found if p.exists()}

    before = outputs()
    build_wheel(tmp_path)
    assert outputs() == before


def test_constraints_pin_the_versions_installed_here(written: dict[str, Any]) -> None:
    from importlib.metadata import version

    text = (written["deployments"]["external"].out_dir / "constraints.txt").read_text()
    pins = dict(line.split("==") for line in text.splitlines() if line and not line.startswith("#"))
    for name in ("onnxruntime", "numpy", "onnx", "uvicorn", "starlette", "openvino"):
        assert pins[name] == version(name), name
    assert "ferry" not in pins
    assert (
        "openvino" not in (written["deployments"]["file"].out_dir / "constraints.txt").read_text()
    )


def test_readme_says_how_to_build_push_and_apply(written: dict[str, Any]) -> None:
    d = written["deployments"]
    text = d["artifact"].readme.read_text()
    assert "docker build -t ghcr.io/acme/digits:1 ." in text
    assert "docker push ghcr.io/acme/digits:1" in text
    assert "kubectl apply -f inferenceservice.yaml" in text
    assert "/v2/models/digits_art/infer" in text
    external = d["external"].readme.read_text()
    assert "kubectl create secret generic mlp-key -n ml --from-literal=token=" in external
    assert "kubectl apply -n ml -f inferenceservice.yaml" in external
    assert "kind load docker-image" in d["file"].readme.read_text()


def test_the_image_tag_follows_the_build_context(
    sources: dict[str, Path], wheel: Path, tmp_path: Path
) -> None:
    first = kserve_manifests(sources["file"], tmp_path / "a", wheel=wheel)
    again = kserve_manifests(sources["file"], tmp_path / "b", wheel=wheel)
    assert first.image == again.image
    other = tmp_path / "Adder_Model.onnx"
    onnx.save(models.add_const(2.5), other)
    changed = kserve_manifests(other, tmp_path / "c", wheel=wheel)
    assert changed.name == first.name and changed.image != first.image


@pytest.mark.parametrize(
    ("stem", "name"),
    [
        ("My_Model", "my-model"),
        ("2024_ResNet50.v2", "resnet50-v2"),
        ("___", "ferry-model"),
        ("a" * 80, "a" * 63),
        ("ab--", "ab"),
    ],
)
def test_default_names_are_dns_1035_labels(stem: str, name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{stem}.onnx"
    onnx.save(models.add_const(1.0), path)
    assert kserve_manifests(path, tmp_path / "out", wheel=False).name == name


# ---------------------------------------------------------------------------------------------
# the CLI: ferry deploy kserve


def _run(*args: str | Path) -> Any:
    return CliRunner().invoke(cli, ["deploy", "kserve", *map(str, args)], prog_name="ferry")


def test_cli_writes_the_folder(sources: dict[str, Path], wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "manifests"
    result = _run(sources["file"], "-o", out, "--wheel", wheel, "--name", "adder", "--cpu", "2")
    assert result.exit_code == 0, result.output
    assert "InferenceService 'adder'" in result.stdout
    assert "kubectl apply -f" in result.stdout
    manifest = kh.load_manifest(out)
    assert kh.container_of(manifest)["resources"]["limits"]["cpu"] == "2"
    assert (out / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    marker = json.loads((out / "ferry-kserve.json").read_text())
    assert sorted(marker["files"]) == sorted(
        p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()
    )


def test_cli_help_has_examples() -> None:
    result = _run("--help")
    assert result.exit_code == 0
    assert "Examples:" in result.output
    assert "ferry deploy kserve model.onnx -o manifests/" in result.output
    for option in ("--storage-uri", "--autoscale", "--api-key-secret", "--no-wheel", "--force"):
        assert option in result.output


def _bad_inputs(sources: dict[str, Path], tmp_path: Path) -> dict[str, tuple[list[Any], str]]:
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    fake = tmp_path / "fake.onnx"
    fake.write_text("not a model either")
    m = sources["file"]
    return {
        "missing model": ([tmp_path / "nope.onnx"], "not found"),
        "not a model": ([text], "is not an .onnx model"),
        "not onnx inside": ([fake], "not a valid ONNX model"),
        "empty repository": ([tmp_path / "empty"], "no models"),
        "bad name": ([m, "--name", "My_Model"], "DNS-1035"),
        "name too long": ([m, "--name", "a" * 64], "DNS-1035"),
        "bad namespace": ([m, "--namespace", "ML"], "namespace"),
        "cpu words": ([m, "--cpu", "2 cpus"], "Kubernetes quantity"),
        "cpu limit below": ([m, "--cpu", "2,1"], "below its request"),
        "memory units": ([m, "--memory", "2GB"], "Kubernetes quantity"),
        "zero memory": ([m, "--memory", "0"], "more than 0"),
        "autoscale order": ([m, "--autoscale", "3,1"], "MIN <= MAX"),
        "autoscale words": ([m, "--autoscale", "two"], "MIN,MAX"),
        "replicas zero": ([m, "--replicas", "0"], "--replicas"),
        "replicas and autoscale": ([m, "--replicas", "2", "--autoscale", "1,3"], "either"),
        "unknown option": ([m, "--replica", "2"], "no such option"),
        "storage without scheme": ([m, "--storage-uri", "/data/models"], "storage URI"),
        "bad image": ([m, "--image", "Acme/Model:1"], "image reference"),
        "bad secret": ([m, "--api-key-secret", "Key_Secret"], "Secret"),
        "unknown backend": ([m, "--backends", "tpu"], "unknown backend"),
        "bad precision": ([m, "--precision", "fp8"], "precision"),
        "wheel twice": ([m, "--no-wheel", "--wheel", text], "not both"),
        "not a wheel": ([m, "--wheel", text], "not a ferry wheel"),
        "negative gpu": ([m, "--gpu", "-1"], "--gpu"),
    }


def test_cli_bad_inputs_are_one_line_and_exit_2(sources: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for case, (args, says) in _bad_inputs(sources, tmp_path).items():
        out = tmp_path / f"out-{case.replace(' ', '-')}"
        result = _run(*args, "-o", out)
        assert result.exit_code == 2, (case, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (case, result.stderr)
        assert lines[0].startswith("error: "), (case, lines)
        assert says in lines[0], (case, lines[0])
        assert "Traceback" not in result.output
        assert not out.exists(), case
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_cli_needs_an_output_folder(sources: dict[str, Path]) -> None:
    result = _run(sources["file"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: missing option '-o' / '--output' (see ferry deploy kserve --help)"
    ]


# ---------------------------------------------------------------------------------------------
# the output folder: atomic, refused when it holds other files unless --force


def test_refuses_a_folder_of_other_files_unless_forced(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = _run(sources["file"], "-o", out, "--no-wheel")
    assert result.exit_code == 2
    assert "--force" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    result = _run(sources["file"], "-o", out, "--no-wheel", "--force")
    assert result.exit_code == 0, result.output
    assert not (out / "keep.txt").exists()
    assert (out / "inferenceservice.yaml").is_file()


def test_replaces_an_earlier_output(sources: dict[str, Path], wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(sources["file"], "-o", out, "--wheel", wheel).exit_code == 0
    assert (out / "model" / "Adder_Model.onnx").is_file()
    again = _run(sources["file"], "-o", out, "--no-wheel", "--storage-uri", "gs://b/m")
    assert again.exit_code == 0, again.output
    assert not (out / "model").exists() and not (out / "wheels").exists()
    env = kh.container_of(kh.load_manifest(out))["env"]
    assert {"name": "STORAGE_URI", "value": "gs://b/m"} in env
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failure_leaves_the_earlier_output_as_it_was(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    kserve_manifests(sources["file"], out, wheel=False)
    before = kh.tree_hash(out)

    def broken(manifest: dict[str, Any]) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kserve_module, "manifest_yaml", broken)
    with pytest.raises(OSError, match="No space left"):
        kserve_manifests(sources["artifact"], out, wheel=False)
    assert kh.tree_hash(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with pytest.raises(OSError):
        kserve_manifests(sources["file"], tmp_path / "new", wheel=False)
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_never_writes_over_or_into_the_model(sources: dict[str, Path], tmp_path: Path) -> None:
    from ferry.errors import InvalidInputError

    before = {k: kh.tree_hash(p) for k, p in sources.items()}
    with pytest.raises(InvalidInputError, match="holds the model"):
        kserve_manifests(sources["external"], sources["external"].parent, force=True, wheel=False)
    with pytest.raises(InvalidInputError, match="holds the model"):
        kserve_manifests(sources["artifact"], sources["artifact"], force=True, wheel=False)
    with pytest.raises(InvalidInputError, match="inside the model folder"):
        kserve_manifests(sources["repo"], sources["repo"] / "out", force=True, wheel=False)
    file_out = tmp_path / "a-file"
    file_out.write_text("x")
    with pytest.raises(InvalidInputError, match="is a file"):
        kserve_manifests(sources["file"], file_out, force=True, wheel=False)
    assert {k: kh.tree_hash(p) for k, p in sources.items()} == before
    assert not (sources["repo"] / "out").exists()


def test_the_command_object_runs_on_its_own(sources: dict[str, Path], tmp_path: Path) -> None:
    """``kserve_command`` is a click command any group can hold (``ferry deploy`` does)."""
    from ferry.cli._deploy_kserve import kserve_command

    runner = CliRunner()
    out = tmp_path / "out"
    result = runner.invoke(
        kserve_command, [str(sources["file"]), "-o", str(out), "--no-wheel"], prog_name="kserve"
    )
    assert result.exit_code == 0, result.output
    assert (out / "inferenceservice.yaml").is_file()
    result = runner.invoke(kserve_command, ["--zzz"], prog_name="kserve")
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: no such option") and "--zzz" in line, line
    assert line.endswith("(see kserve --help)")
