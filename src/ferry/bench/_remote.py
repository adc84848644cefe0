"""``ferry bench --device URL``: run a benchmark on a device where ``ferry agent`` listens.

The client checks the agent and its token (``GET /device``, ``GET /agent``), uploads the model
(the ``.onnx`` file as it is, or a tar holding ``model.onnx``, its external data and the
``--input`` arrays), then polls the job until it ends. It returns the results document the agent
computed, the same as a local :func:`ferry.bench.run_bench` returns, with ``model.path``
and ``model.name`` set to the local model's. Only the standard library speaks HTTP here, so a
client needs no extra.
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ferry.bench._agent import INPUTS_FOLDER
from ferry.bench._spec import BenchSpec, Progress
from ferry.errors import FerryError, InvalidInputError

__all__ = ["AgentClient", "run_remote"]

_POLL_S = 20


class AgentClient:
    """Talks to one agent: ``url`` (``http://HOST:PORT``) with ``token``."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise InvalidInputError(
                f"--device takes the agent's URL, like http://192.168.1.20:8765; got {url!r}"
            )
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Send a request; return the status and the JSON body, errors (4xx/5xx) included.

        Raises:
            FerryError: the agent cannot be reached, refuses the token, or does not answer JSON.
        """
        req = urllib.request.Request(
            self.url + path,
            data=body,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise FerryError(
                f"cannot reach the ferry agent at {self.url}: {reason}; is `ferry agent` running "
                "there, listening on that address (--host), and the port open?"
            ) from e
        if status == 401:
            raise FerryError(
                f"the ferry agent at {self.url} refused the token (401); pass the token it was "
                "started with (--token or $FERRY_AGENT_TOKEN)"
            )
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise FerryError(
                f"{self.url}{path} answered {status} with something that is not JSON; is it a "
                "ferry agent?"
            ) from e
        if not isinstance(data, dict):
            raise FerryError(f"{self.url}{path} answered {status} with unexpected JSON")
        return status, data

    def get(self, path: str, timeout: float | None = None) -> dict[str, Any]:
        status, data = self.request("GET", path, timeout=timeout)
        if status != 200:
            raise FerryError(f"the agent at {self.url} answered {status}: {data.get('error')}")
        return data


def run_remote(
    url: str,
    token: str,
    model: str | os.PathLike[str],
    spec: BenchSpec,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    progress: Progress | None = None,
    poll_s: float = _POLL_S,
) -> dict[str, Any]:
    """Run ``spec`` on ``model`` at the agent at ``url`` and return its results document.

    Raises:
        FerryError: the agent is unreachable, refuses the token, the upload or the spec; the
            model cannot be read there; or the job failed (with the agent's message).
    """
    from ferry.bench._report import check_results
    from ferry.graph import resolve_model_file

    report = progress or (lambda stage, done, total: None)
    client = AgentClient(url, token)
    host = urllib.parse.urlparse(client.url).netloc
    report(f"connecting to {host}", 0, 1)
    client.get("/device")
    limits = client.get("/agent")
    model_file = resolve_model_file(model)
    with tempfile.TemporaryDirectory(prefix="ferry-upload-") as tmp:
        upload = _pack(model_file, dict(inputs or {}), Path(tmp))
        size = upload.stat().st_size
        limit = int(limits.get("max_upload_bytes") or 0)
        if limit and size > limit:
            raise FerryError(
                f"the upload is {size / (1 << 20):.1f} MiB; the agent at {host} takes at most "
                f"{limit / (1 << 20):.1f} MiB (start it with a larger --max-upload-mb)"
            )
        report(f"uploading to {host}", 0, 1)
        with upload.open("rb") as body:
            status, data = client.request(
                "POST",
                "/jobs",
                body=body,
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(size),
                    "X-Ferry-Spec": json.dumps(spec.to_dict()),
                },
                timeout=max(client.timeout, size / (1 << 20)),  # slow links: a second per MiB
            )
    if status != 202:
        raise FerryError(f"the agent at {host} refused the job ({status}): {data.get('error')}")
    job = str(data["id"])
    while True:
        position = data.get("position")
        if data.get("status") == "queued":
            report(f"queued on {host}" + (f" (position {position})" if position else ""), 0, 1)
        else:
            report(f"running on {host}", 0, 1)
        status, data = client.request(
            "GET", f"/jobs/{job}?wait={poll_s:g}", timeout=poll_s + client.timeout
        )
        if status == 422 or data.get("status") == "failed":
            raise FerryError(f"the job on {host} failed: {data.get('error')}")
        if status != 200:
            raise FerryError(f"the agent at {host} answered {status}: {data.get('error')}")
        if data.get("status") == "done":
            break
        time.sleep(0.05)
    results = check_results(data.get("result"))
    results["model"]["path"] = str(model)
    results["model"]["name"] = Path(model).name
    report("done", 1, 1)
    return results


def _pack(model_file: Path, inputs: dict[str, np.ndarray], tmp: Path) -> Path:
    """The body to upload: the model file itself when it stands alone, else a tar of the model,
    its external data files and the input arrays."""
    from ferry.graph import external_files, load_model

    external = external_files(load_model(model_file))
    if not external and not inputs:
        return model_file
    archive = tmp / "upload.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(model_file, arcname="model.onnx")
        for location in external:
            tar.add(model_file.parent / location, arcname=location)
        if inputs:
            names: dict[str, str] = {}
            for i, (name, array) in enumerate(inputs.items()):
                file = f"{i}.npy"
                np.save(tmp / file, np.asarray(array), allow_pickle=False)
                tar.add(tmp / file, arcname=f"{INPUTS_FOLDER}/{file}")
                names[file] = name
            (tmp / "names.json").write_text(json.dumps(names), encoding="utf-8")
            tar.add(tmp / "names.json", arcname=f"{INPUTS_FOLDER}/names.json")
    return archive
