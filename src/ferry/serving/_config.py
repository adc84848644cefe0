"""A served model's configuration: ``config.json`` (Triton's config.pbtxt fields, as JSON), Triton's
own ``config.pbtxt`` (read by :mod:`ferry.serving._pbtxt`), and defaults.

``REPO/<model>/config.json`` or ``REPO/<model>/config.pbtxt`` is optional (not both). config.json's
keys (all optional, no others)::

    {"max_batch_size": 8,
     "dynamic_batching": {"max_queue_delay_microseconds": 500, "preferred_batch_size": [4, 8]},
     "instance_group": [{"count": 2}],
     "backends": ["onnxruntime"],
     "precision": "bf16",
     "optimize": "basic",
     "placement": "fixed",
     "isolate": true,
     "version_policy": {"latest": {"num_versions": 1}}}

The defaults follow Triton's ONNX Runtime autocomplete: when ``max_batch_size`` is not given and every
input and output has a variable leading dim, the model batches (``max_batch_size`` 8) with the dynamic
batcher on (``max_queue_delay_microseconds`` 100); otherwise ``max_batch_size`` is 0 and requests run
as sent. A ``max_batch_size`` given without ``dynamic_batching`` runs each request alone (Triton's
default scheduler). With ``max_batch_size`` > 0 the leading dim of every input and output is the batch
dim: requests carry it, and Triton-style configuration leaves it out of ``dims``.

``precision`` (one of :data:`PRECISIONS`) is what ``ferry.load(..., precision=...)`` takes: the
model runs in it on every engine of its plan that offers it, and fails to load (that model only)
when none does (ONNX Runtime runs fp32 only: pair it with ``"backends": ["openvino"]``, say).
Without it, the server's ``--precision``, else each engine's default (fp32).

``optimize`` (``"basic"``, ``"extended"`` or ``"none"``) runs ``ferry optimize`` on the model at
load, for its first engine, before placement; a result that computes something else or runs
slower is not used (the model loads as it is, with a warning). Without it, the server's
``--optimize`` (default none).

``isolate`` (``true``/``false``) runs the model's instances in worker processes, restarted when
they crash (:mod:`ferry.serving._isolate`); without it, the server's ``--isolate``.

``placement`` (``"live"``, the default, or ``"fixed"``): with several engines offered and sizes
unknown, a model learns its plan from the calls it serves (:class:`ferry.runtime.LiveSession`;
the first instance learns, the others adopt) unless ``"fixed"``. Without it, the server's
``--placement``.

``dynamic_batching.default_queue_policy`` (Triton's: ``max_queue_size``,
``default_timeout_microseconds``, ``timeout_action``, ``allow_timeout_override``) guards the
model's queue: a full one answers 429 at once (:mod:`ferry.serving._admission`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Literal

from ferry._state_names import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX
from ferry.errors import FerryError, InvalidInputError
from ferry.serving._admission import QueuePolicy, parse_queue_policy
from ferry.serving._config_checks import TRITON_TYPES as _TRITON_TYPES
from ferry.serving._config_checks import ConfigError
from ferry.serving._config_checks import check_int as _int
from ferry.serving._config_checks import check_keys as _check_keys

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_QUEUE_DELAY_US",
    "OPTIMIZE_LEVELS",
    "PRECISIONS",
    "ConfigError",
    "ModelConfig",
    "ResolvedConfig",
    "TensorConfig",
    "VersionPolicy",
    "batch_dim_problem",
    "check_optimize",
    "check_precision",
    "parse_config",
    "resolve_config",
    "triton_config",
]

logger = logging.getLogger(__name__)

#: The config files a model folder may hold (one at most).
#: ``max_batch_size`` given to a model whose inputs and outputs all have a variable leading dim.
DEFAULT_MAX_BATCH_SIZE = 8
#: The dynamic batcher's default wait for more requests. Small: on a CPU most batching comes from
#: requests that queue while an instance is busy, and a long wait only adds latency at low load.
DEFAULT_QUEUE_DELAY_US = 100
_MAX_INSTANCES = 64
#: The precisions a served model may ask for (those ``ferry.load`` takes).
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
#: What a served model's ``optimize`` may say (``ferry optimize --level``, or none).
OPTIMIZE_LEVELS = ("none", "basic", "extended")
_MAX_QUEUE_DELAY_US = 10_000_000


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """Which of a model's version folders are served: Triton's ``version_policy``.

    Attributes:
        kind: ``"latest"`` (the ``num_versions`` highest), ``"all"``, or ``"specific"``.
        num_versions: how many of the latest versions, for ``"latest"``.
        versions: the versions served, for ``"specific"``.
    """

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: Sequence[int]) -> list[int]:
        """The versions to serve among ``available``, ascending."""
        ordered = sorted(set(available))
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions :]

    def to_json(self) -> dict[str, Any]:
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"latest": {"num_versions": self.num_versions}}


@dataclasses.dataclass(frozen=True)
class TensorConfig:
    """An input or output as config.pbtxt declares it (Triton's ``ModelInput``/``ModelOutput``).

    Attributes:
        name: the tensor's name in the model.
        data_type: Triton's type name (``TYPE_FP32``).
        dims: the shape clients send or receive, -1 for a variable dim, without the batch dim when
            the model batches.
        reshape: the model's own shape (same conventions) when it differs from ``dims``: requests
            are reshaped to it, and outputs from it; None: the model's shape is ``dims``.
        format: Triton's ``format`` (``FORMAT_NCHW``...), shown by ``/config``.
    """

    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    format: str = "FORMAT_NONE"

    @property
    def model_dims(self) -> tuple[int, ...]:
        """The dims the model itself has (``reshape`` when given, else ``dims``)."""
        return self.dims if self.reshape is None else self.reshape


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A model's config as written: None marks what the model itself decides (see the module doc).

    Attributes:
        max_batch_size: the largest batch one execution takes; 0: no batch dim; None: derive.
        dynamic_batching: whether the dynamic batcher runs; None: on when ``max_batch_size`` is
            derived and > 0.
        max_queue_delay_us: how long the batcher waits for more requests.
        preferred_batch_sizes: batch sizes the batcher sends as soon as it can form them.
        instance_count: copies of the model, each on its own thread; None: decided at load
            (two for a model whose call takes a millisecond or more, else one).
        backends: engines in priority order; None: the server's.
        precision: the precision to run in (one of :data:`PRECISIONS`); None: the server's.
        optimize: the optimization level run at load (one of :data:`OPTIMIZE_LEVELS`); None:
            the server's.
        placement: ``"live"`` (learn the plan from the calls served when sizes are unknown) or
            ``"fixed"`` (the plan made at load); None: the server's.
        version_policy: which versions are served.
        inputs: the inputs config.pbtxt declares (checked against the model; empty: none).
        outputs: the outputs config.pbtxt declares.
        model_filename: the file (or artifact folder) each version folder serves (Triton's
            ``default_model_filename``); None: ``model.onnx``, the one ``*.onnx`` or artifact.
        source: the config file (for messages); None: defaults or a load request's config.
        warnings: what the config asks for that ferry does not do, in words (logged).
    """

    max_batch_size: int | None = None
    dynamic_batching: bool | None = None
    max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US
    preferred_batch_sizes: tuple[int, ...] = ()
    instance_count: int | None = None
    backends: tuple[str, ...] | None = None
    precision: str | None = None
    optimize: str | None = None
    placement: str | None = None
    version_policy: VersionPolicy = dataclasses.field(default_factory=VersionPolicy)
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    model_filename: str | None = None
    source: str | None = None
    warnings: tuple[str, ...] = ()
    #: ``dynamic_batching.default_queue_policy`` (:mod:`ferry.serving._admission`); None: none.
    queue_policy: QueuePolicy | None = None
    #: Run the instances in worker processes (:mod:`ferry.serving._isolate`); None: the server's.
    isolate: bool | None = None
    #: ``sequence_batching``: the model is stateful (:mod:`ferry.serving._sequence`); None: not
    #: declared (``state:*`` inputs still make it stateful).
    sequence_batching: Any = None


@dataclasses.dataclass(frozen=True)
class ResolvedConfig:
    """The config a loaded model runs with: every choice made."""

    max_batch_size: int
    dynamic_batching: bool
    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...]
    instance_count: int


_STATE_PREFIXES = (STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX)

_KEYS = {
    "name",
    "max_batch_size",
    "dynamic_batching",
    "instance_group",
    "backends",
    "precision",
    "optimize",
    "placement",
    "version_policy",
    "isolate",
    "sequence_batching",
}
_BATCHING_KEYS = {"max_queue_delay_microseconds", "preferred_batch_size", "default_queue_policy"}
_INSTANCE_KEYS = {"count", "kind", "name"}


def parse_config(data: Any, name: str, *, source: str = "config") -> ModelConfig:
    """Check a config object (parsed JSON) and turn it into a :class:`ModelConfig`.

    Args:
        data: the parsed JSON.
        name: the model's name; a ``name`` key in the config must match it.
        source: what to call the config in messages (its path).

    Raises:
        ConfigError: an unknown key, a value of the wrong type or range, or rules broken
            (``dynamic_batching`` with ``max_batch_size`` 0, a preferred size above the maximum).
    """
    where = f"{source} of model {name!r}"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a JSON object")
    _check_keys(data, _KEYS, where, "")
    if "name" in data and data["name"] != name:
        raise ConfigError(f"{where}: 'name' is {data['name']!r} but the model folder is {name!r}")
    max_batch = data.get("max_batch_size")
    if max_batch is not None:
        max_batch = _int(max_batch, "max_batch_size", where, minimum=0)
    dynamic: bool | None = None
    policy: QueuePolicy | None = None
    delay = DEFAULT_QUEUE_DELAY_US
    preferred: tuple[int, ...] = ()
    batching = data.get("dynamic_batching")
    if batching is not None:
        if not isinstance(batching, dict):
            raise ConfigError(f"{where}: 'dynamic_batching' must be an object, e.g. {{}}")
        _check_keys(batching, _BATCHING_KEYS, where, "dynamic_batching ")
        dynamic = True
        if "max_queue_delay_microseconds" in batching:
            delay = _int(
                batching["max_queue_delay_microseconds"],
                "dynamic_batching.max_queue_delay_microseconds",
                where,
                minimum=0,
                maximum=_MAX_QUEUE_DELAY_US,
            )
        sizes = batching.get("preferred_batch_size", [])
        if not isinstance(sizes, list):
            raise ConfigError(f"{where}: dynamic_batching.preferred_batch_size must be a list")
        preferred = tuple(
            sorted(
                {_int(s, "dynamic_batching.preferred_batch_size", where, minimum=1) for s in sizes}
            )
        )
        if "default_queue_policy" in batching:
            policy = parse_queue_policy(batching["default_queue_policy"], where, ConfigError)
        if max_batch == 0:
            raise ConfigError(
                f"{where}: dynamic_batching needs max_batch_size > 0 (the batch dim); it is 0"
            )
        if max_batch is not None and preferred and preferred[-1] > max_batch:
            raise ConfigError(
                f"{where}: preferred_batch_size {preferred[-1]} is above max_batch_size {max_batch}"
            )
    instances = _instance_count(data.get("instance_group"), where)
    backends = data.get("backends")
    if backends is not None:
        if (
            not isinstance(backends, list)
            or not backends
            or not all(isinstance(b, str) and b for b in backends)
        ):
            raise ConfigError(
                f"{where}: 'backends' must be a non-empty list of backend names, e.g. "
                '["onnxruntime"]'
            )
        backends = tuple(backends)
    precision = data.get("precision")
    if precision is not None:
        precision = check_precision(precision, f"{where}: 'precision'", ConfigError)
    optimize = data.get("optimize")
    if optimize is not None:
        optimize = check_optimize(optimize, f"{where}: 'optimize'", ConfigError)
    placement = data.get("placement")
    if placement is not None and placement not in ("live", "fixed"):
        raise ConfigError(
            f"{where}: 'placement' must be \"live\" (learn the plan from the calls served) or "
            f'"fixed" (the plan made at load), got {placement!r}'
        )
    return ModelConfig(
        max_batch_size=max_batch,
        dynamic_batching=dynamic,
        max_queue_delay_us=delay,
        preferred_batch_sizes=preferred,
        instance_count=instances,
        backends=backends,
        precision=precision,
        optimize=optimize,
        placement=placement,
        version_policy=_version_policy(data.get("version_policy"), where),
        queue_policy=policy,
        isolate=_flag(data.get("isolate"), "isolate", where),
        sequence_batching=_sequence_batching(data.get("sequence_batching"), where),
    )


def _sequence_batching(data: Any, where: str) -> Any:
    from ferry.serving._sequence import parse_sequence_batching  # it uses this module's helpers

    return None if data is None else parse_sequence_batching(data, where)


def _flag(value: Any, key: str, where: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"{where}: {key!r} must be true or false, got {value!r}")
    return value


def check_precision(
    value: Any, what: str = "precision", error: type[FerryError] = InvalidInputError
) -> str:
    """``value`` if it is one of :data:`PRECISIONS`, else ``error`` naming them (``what`` says
    where the value came from: the config key, the server option)."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise error(
            f"{what} must be one of {', '.join(PRECISIONS)} (an engine of the model's backends "
            f"must offer it; ONNX Runtime runs fp32 only), got {value!r}"
        )
    return value


def check_optimize(
    value: Any, what: str = "optimize", error: type[FerryError] = InvalidInputError
) -> str:
    """``value`` if it is one of :data:`OPTIMIZE_LEVELS`, else ``error`` naming them."""
    if not isinstance(value, str) or value not in OPTIMIZE_LEVELS:
        raise error(f"{what} must be one of {', '.join(OPTIMIZE_LEVELS)}, got {value!r}")
    return value


def _instance_count(groups: Any, where: str) -> int | None:
    if groups is None:
        return None
    if not isinstance(groups, list) or not groups:
        raise ConfigError(
            f"{where}: 'instance_group' must be a non-empty list, e.g. [{{\"count\": 2}}]"
        )
    total = 0
    for group in groups:
        if not isinstance(group, dict):
            raise ConfigError(f"{where}: each instance_group entry must be an object")
        _check_keys(group, _INSTANCE_KEYS, where, "instance_group ")
        kind = group.get("kind", "KIND_CPU")
        if kind not in ("KIND_CPU", "KIND_AUTO"):
            raise ConfigError(
                f"{where}: instance_group kind {kind!r} is not supported; use KIND_CPU or "
                "KIND_AUTO (the engine's device comes from 'backends')"
            )
        total += _int(group.get("count", 1), "instance_group.count", where, minimum=1)
    if total > _MAX_INSTANCES:
        raise ConfigError(f"{where}: {total} instances is more than the {_MAX_INSTANCES} allowed")
    return total


def _version_policy(policy: Any, where: str) -> VersionPolicy:
    if policy is None:
        return VersionPolicy()
    if not isinstance(policy, dict) or len(policy) != 1:
        raise ConfigError(
            f'{where}: \'version_policy\' must be one of {{"latest": {{"num_versions": N}}}}, '
            '{"all": {}}, {"specific": {"versions": [...]}}'
        )
    ((kind, body),) = policy.items()
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: version_policy.{kind} must be an object")
    if kind == "all":
        if body:
            raise ConfigError(f"{where}: version_policy.all takes no keys")
        return VersionPolicy("all")
    if kind == "latest":
        if set(body) - {"num_versions"}:
            raise ConfigError(f"{where}: version_policy.latest takes only num_versions")
        count = _int(
            body.get("num_versions", 1), "version_policy.latest.num_versions", where, minimum=1
        )
        return VersionPolicy("latest", num_versions=count)
    if kind == "specific":
        versions = body.get("versions")
        if set(body) - {"versions"} or not isinstance(versions, list) or not versions:
            raise ConfigError(
                f"{where}: version_policy.specific needs 'versions', a non-empty list of integers"
            )
        picked = tuple(
            sorted(
                {_int(v, "version_policy.specific.versions", where, minimum=0) for v in versions}
            )
        )
        return VersionPolicy("specific", versions=picked)
    raise ConfigError(
        f"{where}: unknown version_policy {kind!r}; use 'latest', 'all' or 'specific'"
    )


def batch_dim_problem(specs: Sequence[Any]) -> str | None:
    """Why these tensors cannot share a batch dim (None when they can): each needs a variable dim 0.

    Args:
        specs: ``TensorSpec``-like objects (``name``, ``shape``), inputs first then outputs.
    """
    for spec in specs:
        shape = spec.shape
        if shape is None:
            return f"{spec.name!r} has unknown rank"
        if len(shape) == 0:
            return f"{spec.name!r} is a scalar"
        if isinstance(shape[0], int):
            return f"{spec.name!r} has a fixed leading dim of {shape[0]}"
    return None


def resolve_config(
    config: ModelConfig, name: str, inputs: Sequence[Any], outputs: Sequence[Any]
) -> ResolvedConfig:
    """Apply ``config`` to a loaded model (its input and output specs): defaults, then checks.

    Raises:
        ConfigError: ``max_batch_size`` > 0 on a model whose inputs or outputs do not all have a
            variable leading dim.
    """
    problem = batch_dim_problem([*inputs, *outputs])
    max_batch = config.max_batch_size
    dynamic = config.dynamic_batching
    if max_batch is None:
        if problem is None:
            max_batch = DEFAULT_MAX_BATCH_SIZE
            dynamic = True if dynamic is None else dynamic
        elif dynamic:
            raise ConfigError(
                f"model {name!r}: dynamic_batching needs a batch dim, a variable leading dim on "
                f"every input and output, but {problem}"
            )
        else:
            max_batch = 0
    elif max_batch > 0 and problem is not None:
        raise ConfigError(
            f"model {name!r}: max_batch_size {max_batch} needs a variable leading (batch) dim on "
            f"every input and output, but {problem}; set max_batch_size to 0"
        )
    preferred = config.preferred_batch_sizes
    if preferred and max_batch and preferred[-1] > max_batch:
        raise ConfigError(
            f"model {name!r}: preferred_batch_size {preferred[-1]} is above max_batch_size {max_batch}"
        )
    if config.inputs or config.outputs:
        _check_declared(config, name, inputs, outputs, batched=max_batch > 0)
    return ResolvedConfig(
        max_batch_size=max_batch,
        dynamic_batching=bool(dynamic) and max_batch > 0,
        max_queue_delay_us=config.max_queue_delay_us,
        preferred_batch_sizes=preferred,
        instance_count=config.instance_count or 1,
    )


def _check_declared(
    config: ModelConfig, name: str, inputs: Sequence[Any], outputs: Sequence[Any], *, batched: bool
) -> None:
    """Check the tensors a config.pbtxt declares against the model's (Triton's rules): names,
    data types, and dims (``reshape`` when given) with -1 where the model's dim is variable; with
    ``batched`` the model's leading (batch) dim is not in ``dims``. Every model input must be
    declared when any is; outputs may be a subset (the others are served too, with a warning)."""
    where = f"{config.source or 'config'} of model {name!r}"
    sequence = config.sequence_batching
    state = {n for s in (sequence.states if sequence is not None else ()) for n in s.names}
    state |= {s.name for s in [*inputs, *outputs] if s.name.startswith(_STATE_PREFIXES)}
    for kind, declared, specs in (
        ("input", config.inputs, inputs),
        ("output", config.outputs, outputs),
    ):
        if not declared:
            continue
        by_name = {s.name: s for s in specs}
        listed = ", ".join(map(repr, by_name)) or "none"
        for tensor in declared:
            spec = by_name.get(tensor.name)
            if spec is None:
                raise ConfigError(
                    f"{where}: {kind} {tensor.name!r} is not in the model; its {kind}s are {listed}"
                )
            model_type = _triton_type_of(spec)
            if model_type is not None and model_type != tensor.data_type:
                raise ConfigError(
                    f"{where}: {kind} {tensor.name!r} is {model_type} in the model, but the "
                    f"config says {tensor.data_type}"
                )
            problem = _dims_problem(spec.shape, tensor.model_dims, batched)
            if problem is not None:
                what = "reshape" if tensor.reshape is not None else "dims"
                raise ConfigError(
                    f"{where}: {kind} {tensor.name!r} has {what} {list(tensor.model_dims)}, "
                    f"but {problem}"
                )
        # A stateful model's state is implicit (Triton's rule): the server feeds it, never a client.
        missing = [n for n in by_name if n not in {t.name for t in declared} and n not in state]
        if missing and kind == "input":
            raise ConfigError(
                f"{where}: the model's input {', '.join(map(repr, missing))} is not declared; "
                "declare every input (or none)"
            )
        if missing:
            logger.warning(
                "%s: the model's output %s is not declared; it is served too",
                where,
                ", ".join(map(repr, missing)),
            )


def _triton_type_of(spec: Any) -> str | None:
    """The model tensor's type as Triton names it (``TYPE_FP32``); None when it has none."""
    if getattr(spec, "onnx_type", None) == "STRING":
        return "TYPE_STRING"
    if getattr(spec, "dtype", None) is None:
        return None
    from ferry.errors import InvalidInputError
    from ferry.serving._codec import datatype_of

    try:
        return _TRITON_TYPES[datatype_of(spec.dtype)]
    except (InvalidInputError, KeyError):
        return None


def _dims_problem(
    shape: Sequence[Any] | None, declared: Sequence[int], batched: bool
) -> str | None:
    """Why ``declared`` dims do not fit the model's ``shape`` (None when they do)."""
    if shape is None:
        return None  # unknown rank: the engine checks at run time
    dims = list(shape[1:] if batched else shape)
    model = [d if isinstance(d, int) else -1 for d in dims]
    batch_note = " after its batch dim" if batched else ""
    if len(model) != len(declared):
        return f"the model has {len(model)} dims{batch_note}: {model}"
    for axis, (want, got) in enumerate(zip(model, declared)):
        if want != -1 and got != want:
            return f"the model's dim {axis}{batch_note} is {want} (model dims: {model})"
    return None


def triton_config(
    *,
    name: str,
    resolved: ResolvedConfig,
    policy: VersionPolicy,
    backends: Sequence[str],
    threads: int,
    precision: str,
    platform: str,
    model_filename: str,
    inputs: Sequence[tuple[str, str, list[int]]],
    outputs: Sequence[tuple[str, str, list[int]]],
    queue: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The model configuration as Triton's ``/config`` endpoint gives it (JSON of ModelConfig).

    Args:
        precision: what the engines run in, as ``parameters.ferry_precision`` says it: ``bf16``
            when every engine of the plan runs in it, else per engine
            (``openvino=bf16,onnxruntime=fp32``).
        inputs: ``(name, KServe datatype, shape with -1 for variable dims)`` per input, the batch
            dim included; it is left out of ``dims`` when ``max_batch_size`` > 0.
        outputs: the same for the outputs.
        queue: the queue policy in force (``default_queue_policy``, the server's limit filled
            in), shown with the dynamic batcher.
    """
    skip = 1 if resolved.max_batch_size > 0 else 0

    def tensors(
        specs: Sequence[tuple[str, str, list[int]]], is_input: bool
    ) -> list[dict[str, Any]]:
        out = []
        for tensor_name, datatype, shape in specs:
            entry: dict[str, Any] = {
                "name": tensor_name,
                "data_type": _TRITON_TYPES[datatype],
                "dims": shape[skip:],
                "is_shape_tensor": False,
            }
            if is_input:
                entry.update(format="FORMAT_NONE", allow_ragged_batch=False, optional=False)
            else:
                entry["label_filename"] = ""
            out.append(entry)
        return out

    config: dict[str, Any] = {
        "name": name,
        "platform": platform,
        "backend": backends[0] if backends else "",
        "version_policy": policy.to_json(),
        "max_batch_size": resolved.max_batch_size,
        "input": tensors(inputs, True),
        "output": tensors(outputs, False),
        "instance_group": [
            {"name": f"{name}_0", "kind": "KIND_CPU", "count": resolved.instance_count, "gpus": []}
        ],
        "default_model_filename": model_filename,
        "parameters": {
            "ferry_backends": {"string_value": ",".join(backends)},
            "ferry_intra_op_threads": {"string_value": str(threads)},
            "ferry_precision": {"string_value": precision},
        },
    }
    if resolved.dynamic_batching:
        config["dynamic_batching"] = {
            "preferred_batch_size": list(resolved.preferred_batch_sizes),
            "max_queue_delay_microseconds": resolved.max_queue_delay_us,
            "preserve_ordering": False,
        }
        if queue is not None:
            config["dynamic_batching"]["default_queue_policy"] = queue
    return config
