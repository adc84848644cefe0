"""The text ``ferry deploy kserve`` writes: the InferenceService (as a dict and as YAML) and the
README that says how to build, push, upload, apply and query it.
"""

from __future__ import annotations

from typing import Any

from ferry.deploy._kserve_image import project_root
from ferry.deploy._kserve_layout import (
    BASE_IMAGE,
    CONSTRAINTS_FILE,
    CONTAINER_PORT,
    DEFAULT_REGISTRY,
    DOCKERFILE,
    DRAIN_TIMEOUT_S,
    GRPC_CONTAINER_PORT,
    KSERVE_API_VERSION,
    LIVENESS_PATH,
    MANIFEST_FILE,
    MODEL_DIR,
    MODEL_MOUNT,
    READINESS_PATH,
    WHEEL_DIR,
    ModelSource,
)

__all__ = ["GENERATION_TIMEOUT_S", "inference_service", "manifest_yaml", "readme_text"]

#: Seconds a request to a generative model may take (a streamed answer included): the
#: predictor's ``timeout`` (Knative's default is 300).
GENERATION_TIMEOUT_S = 900


def inference_service(
    *,
    name: str,
    namespace: str | None,
    image: str,
    command: list[str],
    storage_uri: str | None,
    min_replicas: int,
    max_replicas: int,
    resources: dict[str, dict[str, str]],
    secret: tuple[str, str] | None,
    max_num_seqs: int | None = None,
    protocol: str = "http",
) -> dict[str, Any]:
    """The InferenceService (serving.kserve.io/v1beta1) whose predictor container runs ``command``.

    ``protocol`` grpc: KServe routes the predictor's gRPC port (named ``h2c``, as KServe asks)
    instead of its HTTP one, and the probes ask gRPC's health service
    (:mod:`ferry.serving._grpc_health`), since Knative probes only the routed port.

    ``max_num_seqs``: the predictor serves a generative model that decodes this many sequences
    at once: KServe scales on concurrent requests with that target (a pod's batch full: one
    more replica), and a request may stream for up to :data:`GENERATION_TIMEOUT_S`.
    """
    env: list[dict[str, Any]] = [{"name": "PROTOCOL", "value": "v2"}]
    if storage_uri is not None:
        env.append({"name": "STORAGE_URI", "value": storage_uri})
    if secret is not None:
        env.append(
            {
                "name": "FERRY_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": secret[0], "key": secret[1]}},
            }
        )
    container: dict[str, Any] = {
        "name": "kserve-container",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command[:2],
        "args": command[2:],
        "env": env,
        "ports": [_port(protocol)],
        # Ready once every model loaded and warmed up: that may take a while, and failing here
        # only holds traffic back.
        "readinessProbe": {
            **_probe(protocol, READINESS_PATH, "ready"),
            "initialDelaySeconds": 5,
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        # Live as soon as the server listens (models load in the background): a restart only
        # after a minute and a half without an answer, never for a model still loading.
        "livenessProbe": {
            **_probe(protocol, LIVENESS_PATH, "live"),
            "initialDelaySeconds": 30,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "resources": resources,
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False},
    }
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    predictor: dict[str, Any] = {"minReplicas": min_replicas, "maxReplicas": max_replicas}
    if max_num_seqs is not None:
        # Continuous batching serves max_num_seqs requests at once in a pod: scale on requests in
        # flight, not on CPU (a decoding pod is busy whether it holds 1 sequence or 16).
        predictor["scaleMetric"] = "concurrency"
        predictor["scaleTarget"] = max_num_seqs
        # Knative ends a request after 5 minutes by default; a long stream may need more.
        predictor["timeout"] = GENERATION_TIMEOUT_S
    predictor["containers"] = [container]
    return {
        "apiVersion": KSERVE_API_VERSION,
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {"predictor": predictor},
    }


def _port(protocol: str) -> dict[str, Any]:
    if protocol == "grpc":
        return {"name": "h2c", "containerPort": GRPC_CONTAINER_PORT, "protocol": "TCP"}
    return {"name": "http1", "containerPort": CONTAINER_PORT, "protocol": "TCP"}


def _probe(protocol: str, path: str, service: str) -> dict[str, Any]:
    """An HTTP probe of ``path``, or with gRPC gRPC's health check of ``service``."""
    if protocol == "grpc":
        return {"grpc": {"port": GRPC_CONTAINER_PORT, "service": service}}
    return {"httpGet": {"path": path, "port": CONTAINER_PORT}}


def manifest_yaml(manifest: dict[str, Any]) -> str:
    """``inferenceservice.yaml``'s text: a comment saying how to apply it, then the manifest."""
    import yaml

    head = (
        "# Written by `ferry deploy kserve`: a KServe InferenceService whose predictor runs\n"
        "# ferry serve (KServe v2). Build and push its image first (README.txt), then:\n"
        f"#   kubectl apply -f {MANIFEST_FILE}\n"
    )
    return head + yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)


def readme_text(
    *,
    src: ModelSource,
    name: str,
    namespace: str | None,
    image: str,
    storage_uri: str | None,
    wheel_name: str | None,
    secret: tuple[str, str] | None,
    protocol: str = "http",
) -> str:
    """``README.txt``: the files, then the steps to build, push, upload, apply and query."""
    ns = f" -n {namespace}" if namespace else ""
    model = src.served[0]
    lines = [
        f"KServe InferenceService {name!r}: ferry serve (KServe v2 / Open Inference Protocol)",
        f"serving {src.path} ({src.kind}) as {', '.join(src.served)}.",
        "",
        "Files",
        f"  {MANIFEST_FILE:<24}the InferenceService ({KSERVE_API_VERSION})",
        f"  {DOCKERFILE:<24}the predictor image: {BASE_IMAGE}, ferry[serve], non-root, port "
        f"{CONTAINER_PORT}",
        f"  {WHEEL_DIR + '/':<24}ferry's wheel, built from its source",
        f"  {CONSTRAINTS_FILE:<24}the versions of ferry's dependencies it was tested with",
    ]
    if storage_uri is None:
        lines.append(
            f"  {MODEL_DIR + '/':<24}the model, copied into the image at {src.container_path}"
        )
    lines += ["", "Steps (from this folder)"]
    step = 1
    if wheel_name is not None:
        checkout = project_root() or "/path/to/ferry-checkout"
        lines += [
            f"{step}. Build ferry's wheel into {WHEEL_DIR}/ (the Dockerfile installs "
            f"{WHEEL_DIR}/{wheel_name}):",
            f"     pip wheel --no-deps -w {WHEEL_DIR} {checkout}",
        ]
        step += 1
    lines += [
        f"{step}. Build the image and push it where the cluster pulls from:",
        f"     docker build -t {image} .",
    ]
    if image.startswith(f"{DEFAULT_REGISTRY}/"):
        lines += [
            "     # on kind: kind load docker-image IMAGE; on minikube: minikube image load IMAGE.",
            "     # For a registry, write this folder again with --image REGISTRY/NAME:TAG, then",
            "     # docker push REGISTRY/NAME:TAG.",
        ]
    else:
        lines.append(f"     docker push {image}")
    step += 1
    if storage_uri is not None:
        there = src.path.name
        lines += [
            f"{step}. Upload the model: KServe downloads {storage_uri} to {MODEL_MOUNT} before the",
            f"   predictor starts, and ferry serves {src.container_path}: the URI must name the",
            f"   folder that holds {there!r} under that name"
            + (
                " (or the .onnx file itself, if it has no external data)."
                if src.kind == "file"
                else "."
            ),
        ]
        if storage_uri.startswith(("s3://", "gs://")):
            tool = "aws s3 cp" if storage_uri.startswith("s3://") else "gcloud storage cp"
            target = storage_uri.rstrip("/") + "/"
            if src.kind == "file":
                for rel in src.files:
                    lines.append(f"     {tool} {src.root / rel} {target}{rel.as_posix()}")
            else:
                lines.append(f"     {tool} --recursive {src.path} {target}{there}")
        lines.append(
            "   Credentials: a Secret and ServiceAccount as KServe's storage docs say "
            "(then add serviceAccountName to the predictor)."
        )
        step += 1
    if secret is not None:
        lines += [
            f"{step}. Create the API key's Secret (the predictor reads FERRY_API_KEY from it):",
            f"     kubectl create secret generic {secret[0]}{ns} "
            f'--from-literal={secret[1]}="$FERRY_API_KEY"',
        ]
        step += 1
    lines += [
        f"{step}. Apply it and wait for READY (the model loads and warms up first):",
        f"     kubectl apply{ns} -f {MANIFEST_FILE}",
        f"     kubectl get inferenceservice {name}{ns}",
        "",
        *(_grpc_lines(name, ns, model, secret) if protocol == "grpc" else []),
        "Query it (tritonclient, perf_analyzer and curl speak the same protocol):",
        f"  URL=$(kubectl get inferenceservice {name}{ns} -o jsonpath='{{.status.url}}')",
        f"  curl $URL{READINESS_PATH}",
        f"  curl $URL/v2/models/{model}                 # its inputs and outputs",
        *(
            []
            if model in src.generative  # /infer refuses a generative model: the OpenAI API below
            else [
                f"  curl -X POST $URL/v2/models/{model}/infer -d '{{\"inputs\": [...]}}'"
                + (' -H "Authorization: Bearer $FERRY_API_KEY"' if secret is not None else "")
            ]
        ),
        "",
        *_openai_lines(src, secret),
        "Notes",
        f"- Probes: readiness {READINESS_PATH} (400 until the model is loaded and warmed up),",
        f"  liveness {LIVENESS_PATH} (200 once the server listens, also while a model loads).",
        "- ferry sizes its engine threads from the CPUs the container may run on (its CPU",
        "  affinity), not from the CPU limit: give whole CPUs with requests = limits (Guaranteed",
        "  QoS), which the kubelet's static CPU manager pins.",
        f"- On SIGTERM ferry serve drains requests in flight for up to {DRAIN_TIMEOUT_S} s.",
        *_generative_notes(src),
        "",
    ]
    return "\n".join(lines)


def _grpc_lines(name: str, ns: str, model: str, secret: tuple[str, str] | None) -> list[str]:
    """How to query Triton's gRPC service through KServe's ingress (--protocol grpc)."""
    auth = ', headers={"authorization": "Bearer " + KEY}' if secret is not None else ""
    return [
        f"It speaks Triton's gRPC protocol: KServe routes the predictor's port {GRPC_CONTAINER_PORT}",
        "(named h2c), and the probes ask gRPC's health service (grpc.health.v1: 'ready', 'live').",
        "Its HTTP port stays inside the pod. Through the ingress gateway (INGRESS:PORT), with the",
        "service's host name as the authority (tritonclient.grpc; perf_analyzer -i grpc alike):",
        f"  HOST=$(kubectl get inferenceservice {name}{ns} -o jsonpath='{{.status.url}}' "
        "| cut -d/ -f3)",
        "  import tritonclient.grpc as g",
        '  c = g.InferenceServerClient("INGRESS:PORT",',
        '                              channel_args=[("grpc.default_authority", HOST)])',
        f'  c.is_model_ready("{model}"{auth})',
        "",
    ]


def _openai_lines(src: ModelSource, secret: tuple[str, str] | None) -> list[str]:
    """How to query the generative models: the OpenAI API and Triton's generate extension."""
    if not src.generative:
        return []
    model = next(iter(src.generative))
    auth = ' -H "Authorization: Bearer $FERRY_API_KEY"' if secret is not None else ""
    chat = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hi"}}]}}'
    return [
        f"Generative model{'s' if len(src.generative) > 1 else ''} "
        f"{', '.join(src.generative)}: the OpenAI API at $URL/v1 (KServe's Hugging Face",
        "runtime answers at $URL/openai/v1: give OpenAI clients base_url=$URL/v1 here):",
        f"  curl $URL/v1/models{auth}",
        f"  curl -X POST $URL/v1/chat/completions -H 'Content-Type: application/json'{auth} \\",
        f"       -d '{chat}'",
        '  # streaming: add "stream": true; completions: $URL/v1/completions',
        f"  curl -X POST $URL/v2/models/{model}/generate{auth} "
        """-d '{"text_input": "Hi", "parameters": {"max_tokens": 32}}'""",
        "",
    ]


def _generative_notes(src: ModelSource) -> list[str]:
    if not src.generative:
        return []
    return [
        "- Generative models batch continuously inside the pod (--max-num-seqs sequences at",
        "  once; beyond --max-queue waiting, 429 with Retry-After). KServe scales on requests in",
        "  flight (scaleMetric concurrency, scaleTarget max-num-seqs), and a request may stream",
        f"  for up to {GENERATION_TIMEOUT_S} s (the predictor's timeout). Memory: the weights",
        "  twice plus the KV cache budget (--kv-cache-mib, else max-num-seqs rows of",
        "  max-model-len tokens), and 1 GiB.",
    ]
