"""Triton's ``config.pbtxt``, read with Triton's own schema and mapped onto ferry's config.

The file is parsed with protobuf's ``text_format`` into Triton's ``inference.ModelConfig`` (the
``model_config_pb2`` that ``tritonclient`` ships), then turned into the object a ``config.json``
holds, so that the same checks and defaults apply (:func:`ferry.serving._config.parse_config`).
What ferry does with each field:

- honoured: ``name`` (must be the folder's), ``platform`` ``onnxruntime_onnx``, ``backend``
  ``onnxruntime`` or ``openvino`` (the engine), ``max_batch_size``, ``input``/``output`` (checked
  against the model: names, ``data_type``, ``dims`` with -1 for variable; requests must fit the
  declared dims), ``reshape`` (requests are reshaped to the model's shape and outputs back),
  ``format`` (shown by ``/config``), ``dynamic_batching`` (``preferred_batch_size``,
  ``max_queue_delay_microseconds``, ``default_queue_policy``), ``sequence_batching`` (``state``,
  ``max_sequence_idle_microseconds``; control inputs refused), ``instance_group`` (``count``,
  ``kind`` KIND_CPU or KIND_AUTO, ``name``), ``version_policy``, ``default_model_filename``, and the ``parameters``
  ``ferry_backends`` (``"openvino,onnxruntime"``), ``ferry_precision`` (``"bf16"``) and
  ``ferry_optimize`` (``"basic"``: config.json's ``optimize``).
- refused (the model does not load; the index says why): fields that change what the model
  computes or how requests are answered: another platform or backend, ``runtime``,
  ``ensemble_scheduling``, ``batch_input``/``batch_output``, the dynamic
  batcher's priorities and per-priority queue policies, KIND_GPU/KIND_MODEL instances, ``gpus``,
  ``secondary_devices``, ``passive`` instances, optional/shape/ragged/non-linear-format tensors,
  ``optimization.execution_accelerators`` (name engines with ``ferry_backends`` instead),
  ``model_operations`` (custom op libraries), ``model_repository_agents``, a decoupled
  ``model_transaction_policy``, and any field this code does not know.
- warned about (logged; the model loads): hints that leave the answers unchanged:
  ``label_filename`` (no classification extension), ``model_warmup`` (ferry warms every instance
  up with generated inputs), ``preserve_ordering``, ``rate_limiter``, ``profile``,
  ``host_policy``, the rest of ``optimization``, ``response_cache``, ``model_metrics``,
  ``metric_tags``, ``cc_model_filenames``, other ``parameters``.

``max_batch_size`` as Triton's ONNX Runtime backend completes it: when the config does not declare
both inputs and outputs, a ``max_batch_size`` of 0 (or none) on a model whose inputs and outputs
all have a variable leading dim becomes ferry's default (8, with the dynamic batcher), and a
``max_batch_size`` above 1 turns the dynamic batcher on; when both are declared, the config is
taken as written.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

from ferry.serving._config import ConfigError, ModelConfig, TensorConfig, parse_config

__all__ = ["parse_pbtxt", "triton_schema"]

#: ``parameters`` keys ferry reads.
BACKENDS_PARAMETER = "ferry_backends"
PRECISION_PARAMETER = "ferry_precision"
OPTIMIZE_PARAMETER = "ferry_optimize"

_PLATFORMS = ("", "onnxruntime_onnx")
_BACKENDS = ("", "onnxruntime", "openvino")

# Top-level fields of inference.ModelConfig, by what ferry does with them.
_HONOURED = {
    "name",
    "platform",
    "backend",
    "version_policy",
    "max_batch_size",
    "input",
    "output",
    "dynamic_batching",
    "instance_group",
    "default_model_filename",
    "parameters",
    "optimization",  # execution_accelerators refused, the rest warned about (below)
    "model_transaction_policy",  # decoupled refused (below)
    "sequence_batching",  # checked as config.json's (ferry.serving._sequence)
}
_REFUSED = {
    "runtime": "a backend runtime library is Triton's; ferry runs ONNX models on its engines",
    "batch_input": "ragged batching inputs change what the model receives",
    "batch_output": "ragged batching outputs change what clients receive",
    "ensemble_scheduling": "ensembles are not supported; serve each model on its own",
    "model_operations": "custom operation libraries cannot be loaded",
    "model_repository_agents": "repository agents (checksums, decryption) are not supported",
}
_WARNED = {
    "cc_model_filenames": "per-GPU model files are not used; the version folder's model is served",
    "metric_tags": "metric tags are not added to ferry's metrics",
    "model_warmup": "ferry warms every instance up with generated inputs instead of these samples",
    "response_cache": "responses are not cached; every request runs the model",
    "model_metrics": "custom metric settings are not used",
}


class _Schema:
    """Triton's ``model_config_pb2`` module and protobuf's ``text_format``."""

    def __init__(self, module: Any, text_format: Any) -> None:
        self.module = module
        self.text_format = text_format


@functools.lru_cache(maxsize=1)
def triton_schema() -> _Schema:
    """Triton's ModelConfig schema, as ``tritonclient`` ships it (``tritonclient.grpc``'s
    ``model_config_pb2``; read straight from the wheel when its gRPC extra, grpcio, is missing).

    Raises:
        ConfigError: tritonclient or protobuf is missing, or the schema does not load.
    """
    try:
        from google.protobuf import text_format
    except ImportError as e:
        raise ConfigError(
            f"reading config.pbtxt needs protobuf ({e}); pip install protobuf"
        ) from None
    try:
        from tritonclient.grpc import model_config_pb2

        return _Schema(model_config_pb2, text_format)
    except Exception:  # without grpcio, tritonclient.grpc raises RuntimeError
        pass
    # tritonclient.grpc needs grpcio to import; its model_config_pb2 needs only protobuf.
    name = "ferry.serving._triton_model_config_pb2"
    try:
        import tritonclient

        path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None or not path.is_file():
            raise ImportError(f"no {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except Exception as e:  # whatever stops the schema from loading
        sys.modules.pop(name, None)
        raise ConfigError(
            f"cannot load Triton's model configuration schema from tritonclient ({e}); "
            "pip install tritonclient (and a protobuf it supports)"
        ) from None
    return _Schema(module, text_format)


def parse_pbtxt(text: str, name: str, *, source: str = "config.pbtxt") -> ModelConfig:
    """Parse a Triton ``config.pbtxt`` and map it onto a :class:`ModelConfig` (see the module doc).

    Args:
        text: the file's text (protobuf text format of ``inference.ModelConfig``).
        name: the model's folder name; a ``name`` field must match it.
        source: what to call the file in messages (its path).

    Raises:
        ConfigError: the text does not parse, a field is refused, or a value breaks a rule.
    """
    where = f"{source} of model {name!r}"
    schema = triton_schema()
    message = schema.module.ModelConfig()
    try:
        schema.text_format.Parse(text, message)
    except schema.text_format.ParseError as e:
        raise ConfigError(f"{where} is not a valid Triton model configuration: {e}") from None
    return _Mapper(message, schema.module, name, where).config(source)


class _Mapper:
    """Turns one parsed ``inference.ModelConfig`` into config.json's object, plus what only
    config.pbtxt says (declared tensors, the model file name) and the warnings."""

    def __init__(self, message: Any, module: Any, name: str, where: str) -> None:
        self.m = message
        self.module = module
        self.name = name
        self.where = where
        self.warnings: list[str] = []

    def error(self, text: str) -> ConfigError:
        return ConfigError(f"{self.where}: {text}")

    def warn(self, text: str) -> None:
        self.warnings.append(f"{self.where}: {text}")

    def config(self, source: str) -> ModelConfig:
        m = self.m
        present = {field.name for field, _ in m.ListFields()}
        for field in sorted(present):
            if field in _REFUSED:
                raise self.error(f"{field} is not supported: {_REFUSED[field]}")
            if field in _WARNED:
                self.warn(f"{field} is ignored: {_WARNED[field]}")
            elif field not in _HONOURED:
                raise self.error(f"ferry does not support Triton's field {field!r}")
        data: dict[str, Any] = {}
        if m.name:
            data["name"] = m.name
        backends, precision = self.engines()
        if backends is not None:
            data["backends"] = backends
        if precision is not None:
            data["precision"] = precision
        optimize = {k: v.string_value for k, v in m.parameters.items()}.get(OPTIMIZE_PARAMETER)
        if optimize is not None:
            data["optimize"] = optimize.strip()
        inputs = tuple(self.tensor(t, "input") for t in m.input)
        outputs = tuple(self.tensor(t, "output") for t in m.output)
        for kind, tensors in (("input", inputs), ("output", outputs)):
            names = [t.name for t in tensors]
            duplicate = next((n for n in names if names.count(n) > 1), None)
            if duplicate is not None:
                raise self.error(f"{kind} {duplicate!r} is declared twice")
        declared = bool(inputs) and bool(outputs)
        if m.max_batch_size < 0:
            raise self.error(f"max_batch_size must be >= 0, got {m.max_batch_size}")
        if m.max_batch_size > 0:
            data["max_batch_size"] = m.max_batch_size
        elif declared:
            data["max_batch_size"] = 0
        # else: Triton's backend completes it from the model; ferry derives it the same way.
        if m.HasField("dynamic_batching"):
            data["dynamic_batching"] = self.dynamic_batching()
        elif m.max_batch_size > 1 and not declared:
            data["dynamic_batching"] = {}  # what Triton's ONNX Runtime backend completes
        if m.HasField("sequence_batching"):
            from google.protobuf import json_format

            data["sequence_batching"] = json_format.MessageToDict(
                m.sequence_batching, preserving_proto_field_name=True
            )
            if m.max_batch_size > 0:  # Triton's sequence batcher batches sequences: ferry's
                # dynamic batcher does, with the strategy's delay (the two are a oneof there)
                sequence = m.sequence_batching
                strategy = sequence.oldest if sequence.HasField("oldest") else sequence.direct
                delay = strategy.max_queue_delay_microseconds
                data["dynamic_batching"] = {"max_queue_delay_microseconds": delay}
        if m.instance_group:
            data["instance_group"] = [self.instance_group(g) for g in m.instance_group]
        if m.HasField("version_policy"):
            data["version_policy"] = self.version_policy()
        if m.HasField("optimization"):
            self.optimization()
        if m.HasField("model_transaction_policy") and m.model_transaction_policy.decoupled:
            raise self.error(
                "model_transaction_policy.decoupled is not supported: ferry answers each request "
                "with one response"
            )
        filename = m.default_model_filename or None
        if filename is not None and (
            Path(filename).name != filename or filename in (".", "..") or "\\" in filename
        ):
            raise self.error(
                f"default_model_filename must be a file name in the version folder, got {filename!r}"
            )
        config = parse_config(data, self.name, source=source)
        return dataclasses.replace(
            config,
            inputs=inputs,
            outputs=outputs,
            model_filename=filename,
            source=source,
            warnings=tuple(self.warnings),
        )

    def engines(self) -> tuple[list[str] | None, str | None]:
        """``(backends, precision)`` from ``platform``, ``backend`` and ``parameters``."""
        m = self.m
        if m.platform not in _PLATFORMS:
            raise self.error(
                f"platform {m.platform!r} is not supported: ferry serves ONNX models (platform "
                "'onnxruntime_onnx', or backend 'onnxruntime' or 'openvino')"
            )
        if m.backend not in _BACKENDS:
            raise self.error(
                f"backend {m.backend!r} is not supported: ferry serves ONNX models with backend "
                "'onnxruntime' or 'openvino' (choose engines with the parameter "
                f"{BACKENDS_PARAMETER!r})"
            )
        if m.platform == "onnxruntime_onnx" and m.backend == "openvino":
            raise self.error(
                "platform 'onnxruntime_onnx' and backend 'openvino' disagree; keep one"
            )
        params = {key: value.string_value for key, value in m.parameters.items()}
        known = (BACKENDS_PARAMETER, PRECISION_PARAMETER, OPTIMIZE_PARAMETER)
        others = sorted(k for k in params if k not in known)
        if others:
            self.warn(
                f"parameters {', '.join(map(repr, others))} are ignored (ferry reads "
                f"{', '.join(map(repr, known))})"
            )
        backends: list[str] | None = None
        if BACKENDS_PARAMETER in params:
            backends = [b.strip() for b in params[BACKENDS_PARAMETER].split(",")]
            if not all(backends):
                raise self.error(
                    f"parameter {BACKENDS_PARAMETER!r} must be comma-separated backend names, "
                    f'e.g. "openvino,onnxruntime"; got {params[BACKENDS_PARAMETER]!r}'
                )
        elif m.backend == "openvino":
            backends = ["openvino"]
        precision = params.get(PRECISION_PARAMETER)
        return backends, precision.strip() if precision is not None else None

    def tensor(self, t: Any, kind: str) -> TensorConfig:
        what = f"{kind} {t.name!r}"
        if not t.name:
            raise self.error(f"an {kind} has no name")
        refused = {
            "optional": "optional inputs are not supported: requests must carry every input",
            "is_shape_tensor": "shape tensors (TensorRT) are not supported",
            "allow_ragged_batch": "ragged batching is not supported",
            "is_non_linear_format_io": "non-linear formats (TensorRT) are not supported",
        }
        for field, _ in t.ListFields():
            if field.name in refused:
                raise self.error(f"{what}: {field.name} is not supported: {refused[field.name]}")
        if kind == "output" and t.label_filename:
            self.warn(
                f"{what}: label_filename is ignored: ferry has no classification extension, "
                "outputs are sent as tensors"
            )
        if t.data_type == 0:
            raise self.error(f"{what} needs a data_type, e.g. TYPE_FP32")
        data_type = self.module.DataType.Name(t.data_type)
        dims = tuple(int(d) for d in t.dims)
        if not dims:
            raise self.error(
                f"{what} needs dims; a scalar is dims: [ 1 ] with reshape: {{ shape: [ ] }}"
            )
        self.check_dims(dims, f"{what} dims")
        reshape: tuple[int, ...] | None = None
        if t.HasField("reshape"):
            reshape = tuple(int(d) for d in t.reshape.shape)
            self.check_dims(reshape, f"{what} reshape")
            if sum(d == -1 for d in reshape) > 1:
                raise self.error(f"{what}: reshape may have one variable (-1) dim at most")
            fixed_dims, fixed_reshape = _count(dims), _count(reshape)
            if (fixed_dims is None) != (fixed_reshape is None) or (
                fixed_dims is not None and fixed_dims != fixed_reshape
            ):
                raise self.error(
                    f"{what}: dims {list(dims)} and reshape {list(reshape)} do not hold the same "
                    "number of elements"
                )
        fmt = "FORMAT_NONE"
        if kind == "input":
            fmt = self.module.ModelInput.Format.Name(t.format)
        return TensorConfig(t.name, data_type, dims, reshape, fmt)

    def check_dims(self, dims: tuple[int, ...], what: str) -> None:
        bad = [d for d in dims if d == 0 or d < -1]
        if bad:
            raise self.error(f"{what} must be positive or -1 (variable), got {list(dims)}")

    def dynamic_batching(self) -> dict[str, Any]:
        b = self.m.dynamic_batching
        refused = {"priority_levels", "default_priority_level", "priority_queue_policy"}
        for field, _ in b.ListFields():
            if field.name in refused:
                raise self.error(
                    f"dynamic_batching.{field.name} is not supported: ferry's batcher has one "
                    "queue, without priorities (default_queue_policy applies to it)"
                )
            if field.name == "preserve_ordering":
                self.warn(
                    "dynamic_batching.preserve_ordering is ignored: each request gets its own "
                    "response as soon as its batch is done"
                )
        # Triton's default delay is 0 (the field's default): taken as written.
        data: dict[str, Any] = {
            "max_queue_delay_microseconds": int(b.max_queue_delay_microseconds),
            "preferred_batch_size": [int(s) for s in b.preferred_batch_size],
        }
        if b.HasField("default_queue_policy"):  # ferry.serving._admission checks it
            p = b.default_queue_policy
            action = self.module.ModelQueuePolicy.TimeoutAction.Name(p.timeout_action)
            data["default_queue_policy"] = {
                "max_queue_size": int(p.max_queue_size),
                "timeout_action": action,
                "default_timeout_microseconds": int(p.default_timeout_microseconds),
                "allow_timeout_override": bool(p.allow_timeout_override),
            }
        return data

    def instance_group(self, g: Any) -> dict[str, Any]:
        kind = self.module.ModelInstanceGroup.Kind.Name(g.kind)
        label = f"instance_group {g.name!r}" if g.name else "instance_group"
        if kind not in ("KIND_CPU", "KIND_AUTO"):
            raise self.error(
                f"{label} kind {kind} is not supported: ferry runs instances on the engines of "
                f"the model's plan (choose them with the parameter {BACKENDS_PARAMETER!r}, e.g. "
                '"tensorrt"); use KIND_CPU'
            )
        for field, _ in g.ListFields():
            if field.name in ("gpus", "secondary_devices", "passive"):
                raise self.error(f"{label}: {field.name} is not supported")
            if field.name in ("rate_limiter", "profile", "host_policy"):
                self.warn(f"{label}: {field.name} is ignored")
        group: dict[str, Any] = {"count": max(1, int(g.count)), "kind": kind}  # Triton: 0 -> 1
        if g.name:
            group["name"] = g.name
        return group

    def version_policy(self) -> dict[str, Any]:
        policy = self.m.version_policy
        choice = policy.WhichOneof("policy_choice")
        if choice == "all":
            return {"all": {}}
        if choice == "specific":
            return {"specific": {"versions": [int(v) for v in policy.specific.versions]}}
        if choice == "latest":
            return {"latest": {"num_versions": int(policy.latest.num_versions)}}
        return {"latest": {"num_versions": 1}}

    def optimization(self) -> None:
        fields = sorted(f.name for f, _ in self.m.optimization.ListFields())
        if "execution_accelerators" in fields:
            raise self.error(
                "optimization.execution_accelerators is not supported: name ferry's engines "
                f'with parameters {{ key: "{BACKENDS_PARAMETER}" value: {{ string_value: '
                '"openvino,onnxruntime" } } (and "ferry_precision" for the precision)'
            )
        if fields:
            self.warn(
                f"optimization ({', '.join(fields)}) is ignored: ferry's engines choose their "
                "own graph optimizations"
            )


def _count(dims: tuple[int, ...]) -> int | None:
    """The number of elements ``dims`` hold (None when one is variable)."""
    return None if any(d < 0 for d in dims) else math.prod(dims)
