"""Validates InferenceService YAML files with the KServe Python SDK's own types.

Runs in the environment scripts/setup-kserve.sh makes (kserve 0.21 pins protobuf and pandas
older than ferry's), as ``$FERRY_KSERVE_PYTHON _kserve_validate.py FILE.yaml...``. For each
file: every document is deserialized into ``kserve.V1beta1InferenceService`` by the SDK's
``ApiClient``, the Kubernetes types it names (V1ObjectMeta, V1Container...) by the Kubernetes
client's own ``from_dict`` (the SDK's generated client looks for them in ``kserve.models``), and
serialized back with ``sanitize_for_serialization``. Prints one JSON object per file: the
round trip, what was lost or changed in it, and the predictor as the SDK's objects read it.
Exit status 0 even when a file does not validate (the JSON says why); 2 for bad usage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import kserve
import kubernetes.client
import yaml
from kserve.constants import constants


class SdkClient(kserve.ApiClient):
    """The SDK's ApiClient, resolving the Kubernetes types its models name."""

    def _ApiClient__deserialize(self, data: Any, klass: Any) -> Any:
        if (
            isinstance(klass, str)
            and not klass.startswith(("list[", "dict("))
            and klass not in self.NATIVE_TYPES_MAPPING
            and not hasattr(kserve.models, klass)
        ):
            klass = getattr(kubernetes.client.models, klass)
            if data is not None and hasattr(klass, "from_dict"):
                # The Kubernetes client's models read themselves (pydantic, camelCase keys).
                return klass.from_dict(data)
        return super()._ApiClient__deserialize(data, klass)

    def from_dict(self, data: Any, klass: str) -> Any:
        return self._ApiClient__deserialize(data, klass)


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where ``b`` differs from ``a``, as JSON-ish paths."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}"
            if key not in b:
                out.append(f"{where}: dropped")
            elif key not in a:
                out.append(f"{where}: added")
            else:
                out.extend(differences(a[key], b[key], where))
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items became {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if a != b or type(a) is not type(b):
        return [f"{path}: {a!r} became {b!r}"]
    return []


def probe(p: Any) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "path": p.http_get.path if p.http_get else None,
        "port": p.http_get.port if p.http_get else None,
        "grpc": (p.grpc.port, p.grpc.service) if getattr(p, "grpc", None) else None,
        "initial_delay_seconds": p.initial_delay_seconds,
        "period_seconds": p.period_seconds,
        "timeout_seconds": p.timeout_seconds,
        "failure_threshold": p.failure_threshold,
    }


def predictor_view(isvc: Any) -> dict[str, Any]:
    """The predictor as the SDK's objects hold it (attribute access, not the dict)."""
    predictor = isvc.spec.predictor
    container = predictor.containers[0]
    env = {}
    for var in container.env or []:
        if var.value_from is not None and var.value_from.secret_key_ref is not None:
            ref = var.value_from.secret_key_ref
            env[var.name] = {"secret": ref.name, "key": ref.key}
        else:
            env[var.name] = var.value
    return {
        "type": type(isvc).__name__,
        "container_type": type(container).__name__,
        "name": isvc.metadata.name,
        "namespace": isvc.metadata.namespace,
        "min_replicas": predictor.min_replicas,
        "max_replicas": predictor.max_replicas,
        "containers": len(predictor.containers),
        "container": container.name,
        "image": container.image,
        "command": container.command,
        "args": container.args,
        "env": env,
        "ports": [
            {"name": p.name, "container_port": p.container_port, "protocol": p.protocol}
            for p in container.ports or []
        ],
        "readiness": probe(container.readiness_probe),
        "liveness": probe(container.liveness_probe),
        "requests": dict(container.resources.requests or {}),
        "limits": dict(container.resources.limits or {}),
        "run_as_non_root": container.security_context.run_as_non_root
        if container.security_context
        else None,
    }


def validate(path: str) -> dict[str, Any]:
    client = SdkClient()
    with Path(path).open(encoding="utf-8") as f:
        documents = [d for d in yaml.safe_load_all(f) if d is not None]
    result: dict[str, Any] = {
        "file": path,
        "documents": len(documents),
        "sdk_version": getattr(kserve, "__version__", None),
        "api_version_expected": constants.KSERVE_V1BETA1,
        "kind_expected": constants.KSERVE_KIND_INFERENCESERVICE,
        "results": [],
    }
    for document in documents:
        item: dict[str, Any] = {}
        try:
            isvc = client.from_dict(document, "V1beta1InferenceService")
            back = client.sanitize_for_serialization(isvc)
            item["equal"] = back == document
            item["differences"] = differences(document, back)
            item["predictor"] = predictor_view(isvc)
        except Exception as e:  # what the SDK says is the answer
            item["error"] = f"{type(e).__name__}: {e}"
        result["results"].append(item)
    return result


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: _kserve_validate.py FILE.yaml...", file=sys.stderr)
        return 2
    for path in argv:
        print(json.dumps(validate(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
