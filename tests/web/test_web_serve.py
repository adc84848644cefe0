"""``ferry serve`` serving web bundles at ``/web/<model>/``: MIME types, isolation headers, traversal.

No browser: Starlette's TestClient. Bundles are made by the exporter (Node and npm: the ``npm``
fixture), once for the module, without the Node verification (``test_web_export`` does that).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from starlette.testclient import TestClient

from ferry.errors import InvalidInputError
from ferry.serving import create_app
from ferry.web import export_web

pytestmark = pytest.mark.usefixtures("npm")

ISOLATION = {
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-embedder-policy": "require-corp",
    "cross-origin-resource-policy": "same-origin",
}


def _relu() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("serve") / "relu"
    export_web(_relu(), folder, verify=False)
    return folder


@pytest.fixture
def repo(tmp_path: Path, site: Path) -> Path:
    """A repository whose model ``relu`` has a ``web/`` bundle beside its version folder."""
    root = tmp_path / "models"
    (root / "relu" / "1").mkdir(parents=True)
    onnx.save(_relu(), root / "relu" / "1" / "model.onnx")
    shutil.copytree(site, root / "relu" / "web")
    return root


@contextlib.contextmanager
def _client(source: Path, **kwargs: object) -> Iterator[TestClient]:
    """A client of the app serving ``source``, once its models have been tried (the first
    requests would otherwise race the model's load)."""
    app = create_app(source, warmup=False, **kwargs)  # type: ignore[arg-type]
    with TestClient(app) as client:
        assert app.state.ferry.started.wait(60)
        yield client


@pytest.mark.parametrize(
    ("path", "media"),
    [
        ("", "text/html"),
        ("index.html", "text/html"),
        ("ferry.js", "text/javascript"),
        ("ort/ort.min.mjs", "text/javascript"),
        ("ort/ort-wasm-simd-threaded.jsep.mjs", "text/javascript"),
        ("ort/ort-wasm-simd-threaded.jsep.wasm", "application/wasm"),
        ("manifest.json", "application/json"),
        ("model.onnx", "application/octet-stream"),
    ],
)
def test_repository_bundle_files_with_mime_and_isolation_headers(
    repo: Path, path: str, media: str
) -> None:
    with _client(repo) as client:
        r = client.get(f"/web/relu/{path}")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].split(";")[0] == media
    for header, value in ISOLATION.items():
        assert r.headers[header] == value
    expected = repo / "relu" / "web" / (path or "index.html")
    assert r.content == expected.read_bytes()


def test_folder_url_redirects_to_the_slash(repo: Path) -> None:
    with _client(repo) as client:
        r = client.get("/web/relu", follow_redirects=False)
        assert r.status_code == 308 and r.headers["location"] == "/web/relu/"
        assert client.head("/web/relu/ferry.js").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/web/relu/%2e%2e/1/model.onnx",
        "/web/relu/..%2f1%2fmodel.onnx",
        "/web/relu/ort/%2e%2e/%2e%2e/1/model.onnx",
        "/web/relu/%2fetc%2fpasswd",
        "/web/relu/.%2e/config.json",
        "/web/relu/ort/",
        "/web/relu/nope.js",
        "/web/relu/.hidden",
        "/web/..%2f..%2fetc/passwd",
        "/web/missing/",
    ],
)
def test_traversal_and_unknown_paths_are_404(repo: Path, path: str) -> None:
    (repo / "relu" / "web" / ".hidden").write_text("secret")
    with _client(repo) as client:
        r = client.get(path)
    assert r.status_code == 404, (path, r.text)
    assert b"relu" not in r.content or b"not found" in r.content or b"no web bundle" in r.content


def test_links_leading_outside_are_refused(repo: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (repo / "relu" / "web" / "leak.txt").symlink_to(secret)
    with _client(repo) as client:
        assert client.get("/web/relu/leak.txt").status_code == 404


def test_a_bundle_served_as_the_model_itself(site: Path) -> None:
    """``ferry serve site/``: the bundle's model over KServe and its page at /web/site/."""
    with _client(site) as client:
        assert client.get("/web/relu/").status_code == 200
        assert client.get("/v2/models/relu").json()["name"] == "relu"


def test_web_mounts(tmp_path: Path, site: Path, mlp_path: Path) -> None:
    many = tmp_path / "sites"
    many.mkdir()
    shutil.copytree(site, many / "a")
    shutil.copytree(site, many / "b")
    (many / "not-a-bundle").mkdir()
    with _client(mlp_path, web=[str(site), str(many), f"named={site}"]) as client:
        for name in ("relu", "a", "b", "named"):
            r = client.get(f"/web/{name}/ort/ort-wasm-simd-threaded.jsep.wasm")
            assert r.status_code == 200 and r.headers["content-type"] == "application/wasm"
        assert client.get("/web/not-a-bundle/").status_code == 404
        assert client.get("/web/mlp/").status_code == 404  # a served model without a bundle
    with _client(mlp_path, web={"m": site}) as client:
        assert client.get("/web/m/").status_code == 200


def test_bad_web_mounts_are_clear_errors(tmp_path: Path, site: Path, mlp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidInputError, match="no web bundle"):
        create_app(mlp_path, web=[str(empty)])
    with pytest.raises(InvalidInputError, match="two web bundles named"):
        create_app(mlp_path, web=[str(site), f"relu={site}"])
    with pytest.raises(InvalidInputError, match="invalid model name"):
        create_app(mlp_path, web=[f"../x={site}"])


def test_api_key_does_not_hide_the_page(repo: Path) -> None:
    with _client(repo, api_key="k") as client:
        assert client.get("/web/relu/").status_code == 200
        assert client.post("/v2/repository/index").status_code == 401
