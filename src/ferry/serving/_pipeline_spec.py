"""A pipeline's file, read and checked: ``pipeline.json`` or Triton's ensemble ``config.pbtxt``.

A pipeline is a repository model whose folder holds one of:

- ``pipeline.json``: ferry's declarative form::

      {
        "max_batch_size": 0,
        "inputs":  [{"name": "image", "datatype": "UINT8", "dims": [-1, -1, 3]}],
        "outputs": [{"name": "text", "datatype": "BYTES", "dims": [-1]}],
        "steps": [
          {"name": "prep", "python": "steps:prepare",
           "inputs": {"image": "image"}, "outputs": {"x": "page"}},
          {"name": "det", "model": "ppocr_det", "version": 1,
           "inputs": {"x": "page"}, "outputs": {"sigmoid_0.tmp_0": "prob"}}
        ]
      }

  A step runs a repository ``model`` (optionally a ``version``; default its highest serving
  one) or a ``python`` function ``module:function`` from ``<module>.py`` in the pipeline's
  folder. Its ``inputs`` and ``outputs`` map the step's own tensor names to the pipeline's
  tensor names (as Triton's ``input_map``/``output_map`` do): a step reads pipeline inputs and
  what earlier steps wrote.
- ``config.pbtxt`` with ``platform: "ensemble"``: Triton's ensemble, read as it is
  (``input``, ``output``, ``max_batch_size``, ``ensemble_scheduling { step [...] }``).

``dims`` leave out the batch dim when ``max_batch_size`` > 0 (Triton's convention).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ferry.serving._codec import DATATYPES
from ferry.serving._config import ConfigError

__all__ = [
    "PIPELINE_FILE",
    "PipelineSpec",
    "Step",
    "TensorDecl",
    "as_json",
    "find_pipeline_file",
    "read_pipeline",
]

#: ferry's pipeline file, in a model's folder of the repository.
PIPELINE_FILE = "pipeline.json"
_ENSEMBLE = re.compile(r'^\s*platform\s*:\s*"ensemble"', re.MULTILINE)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STEP_KEYS = {"name", "model", "version", "python", "inputs", "outputs"}
_TOP_KEYS = {"max_batch_size", "inputs", "outputs", "steps"}


@dataclasses.dataclass(frozen=True)
class TensorDecl:
    """A pipeline input or output: its name, KServe datatype and dims (-1: any size)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a pipeline.

    Attributes:
        number: its place in the file, from 1 (what error messages say).
        name: its name (default: its model's or function's).
        model: the repository model it runs (None for a Python step).
        version: that model's version (None: the highest serving one).
        python: ``module:function`` for a Python step (None for a model step).
        function: the loaded Python function (None for a model step).
        inputs: the step's own input name -> the pipeline tensor it reads.
        outputs: the step's own output name -> the pipeline tensor it writes.
    """

    number: int
    name: str
    model: str | None
    version: str | None
    python: str | None
    function: Callable[..., Any] | None
    inputs: dict[str, str]
    outputs: dict[str, str]

    @property
    def label(self) -> str:
        """``step 2 'rec' (model ppocr_rec)``: how errors name it."""
        what = f"model {self.model}" if self.model is not None else f"python {self.python}"
        return f"step {self.number} {self.name!r} ({what})"


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """A pipeline as its file declares it, checked.

    Attributes:
        name: the pipeline's (model) name.
        source: the file it was read from.
        kind: ``"pipeline"`` (pipeline.json) or ``"ensemble"`` (config.pbtxt).
        max_batch_size: 0: ``dims`` are whole shapes; > 0: a batch dim comes first.
        inputs: what requests send.
        outputs: what responses give.
        steps: in file order.
        waves: the steps in running order: each wave's steps read only pipeline inputs and
            earlier waves' outputs, so they run concurrently.
    """

    name: str
    source: Path
    kind: str
    max_batch_size: int
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    steps: tuple[Step, ...]
    waves: tuple[tuple[Step, ...], ...]

    @property
    def models(self) -> list[str]:
        """The repository models its steps run, once each, in step order."""
        return list(dict.fromkeys(s.model for s in self.steps if s.model is not None))


def find_pipeline_file(model_dir: Path) -> Path | None:
    """The pipeline file of a model folder (``pipeline.json``, or a ``config.pbtxt`` whose
    platform is ``ensemble``); None when the folder holds a plain model."""
    candidate = model_dir / PIPELINE_FILE
    if candidate.is_file():
        return candidate
    pbtxt = model_dir / "config.pbtxt"
    try:
        if pbtxt.is_file() and _ENSEMBLE.search(pbtxt.read_text(encoding="utf-8")):
            return pbtxt
    except (OSError, UnicodeDecodeError):
        return None  # read_config will say what is wrong with it
    return None


def read_pipeline(name: str, path: Path, exists: Callable[[str], bool]) -> PipelineSpec:
    """Read and check a pipeline file; import its Python steps (blocking).

    Args:
        name: the pipeline's model name.
        path: its ``pipeline.json`` or ensemble ``config.pbtxt``.
        exists: whether the repository has a model of a name.

    Raises:
        ConfigError: the file cannot be read, breaks a rule, wires a tensor nobody writes,
            names a model the repository lacks, or a Python step does not import.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    if path.name == PIPELINE_FILE:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        spec = _from_json(data, name, path)
    else:
        spec = _from_ensemble(text, name, path)
    for step in spec.steps:
        if step.model == name:
            raise ConfigError(f"{path}: {step.label} runs the pipeline itself; name another model")
        if step.model is not None and not exists(step.model):
            raise ConfigError(
                f"{step.label} runs model {step.model!r}, which is not in the repository; "
                "add it or fix the step's model name"
            )
    return spec


# -- pipeline.json ------------------------------------------------------------------------------


def _from_json(data: Any, name: str, path: Path) -> PipelineSpec:
    where = str(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a JSON object with 'inputs', 'outputs' and 'steps'")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; a pipeline has {', '.join(sorted(_TOP_KEYS))}"
        )
    max_batch = data.get("max_batch_size", 0)
    if type(max_batch) is not int or max_batch < 0:
        raise ConfigError(f"{where}: 'max_batch_size' must be an integer >= 0, got {max_batch!r}")
    inputs = _tensors(data.get("inputs"), "inputs", where)
    outputs = _tensors(data.get("outputs"), "outputs", where)
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise ConfigError(f"{where}: 'steps' must be a non-empty list of steps")
    steps = [_json_step(raw, i, path) for i, raw in enumerate(raw_steps, 1)]
    return _checked(name, path, "pipeline", max_batch, inputs, outputs, steps)


def _tensors(raw: Any, key: str, where: str) -> tuple[TensorDecl, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            f"{where}: {key!r} must be a non-empty list of "
            '{"name": ..., "datatype": "FP32", "dims": [-1, 3]}'
        )
    out = []
    for item in raw:
        if not isinstance(item, dict) or set(item) != {"name", "datatype", "dims"}:
            raise ConfigError(
                f"{where}: each of {key!r} needs exactly 'name', 'datatype' and 'dims', "
                f"got {item!r}"
            )
        out.append(_tensor(item["name"], item["datatype"], item["dims"], f"{where} {key}"))
    return tuple(out)


def _tensor(name: Any, datatype: Any, dims: Any, where: str) -> TensorDecl:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: a tensor name must be a non-empty string, got {name!r}")
    if datatype not in DATATYPES:
        raise ConfigError(
            f"{where}: tensor {name!r} has datatype {datatype!r}; use one of {', '.join(DATATYPES)}"
        )
    if not isinstance(dims, (list, tuple)) or not all(type(d) is int and d >= -1 for d in dims):
        raise ConfigError(
            f"{where}: tensor {name!r} dims must be a list of sizes (-1: any), got {dims!r}"
        )
    return TensorDecl(name, datatype, tuple(dims))


def _json_step(raw: Any, number: int, path: Path) -> Step:
    where = f"{path}: step {number}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be an object with 'model' or 'python'")
    unknown = sorted(set(raw) - _STEP_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; a step has {', '.join(sorted(_STEP_KEYS))}"
        )
    model, python = raw.get("model"), raw.get("python")
    if (model is None) == (python is None):
        raise ConfigError(
            f"{where} needs exactly one of 'model' (a repository model) or "
            "'python' ('module:function' in the pipeline's folder)"
        )
    version = raw.get("version")
    if version is not None:
        if python is not None:
            raise ConfigError(f"{where}: a Python step has no 'version'")
        if type(version) is not int or version < 1:
            raise ConfigError(f"{where}: 'version' must be an integer >= 1, got {version!r}")
    function = None
    if model is not None:
        if not isinstance(model, str) or not model:
            raise ConfigError(f"{where}: 'model' must be a model name, got {model!r}")
        default = model
    else:
        function = _python_function(python, path.parent, where)
        default = str(python).split(":")[1]
    step_name = raw.get("name", default)
    if not isinstance(step_name, str) or not step_name:
        raise ConfigError(f"{where}: 'name' must be a non-empty string, got {step_name!r}")
    return Step(
        number=number,
        name=step_name,
        model=model,
        version=None if version is None else str(version),
        python=python,
        function=function,
        inputs=_mapping(raw.get("inputs"), "inputs", where),
        outputs=_mapping(raw.get("outputs"), "outputs", where),
    )


def _mapping(raw: Any, key: str, where: str) -> dict[str, str]:
    if (
        not isinstance(raw, dict)
        or not raw
        or not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in raw.items())
    ):
        raise ConfigError(
            f"{where}: {key!r} must map the step's tensor names to the pipeline's "
            f'({{"x": "image"}}), got {raw!r}'
        )
    return dict(raw)


def _python_function(spec: Any, folder: Path, where: str) -> Callable[..., Any]:
    """Import ``module:function`` from ``folder/module.py`` (a plain module name, so the file is
    in the pipeline's folder and nowhere else)."""
    parts = spec.split(":") if isinstance(spec, str) else []
    if len(parts) != 2 or not all(_IDENT.fullmatch(p) for p in parts):
        raise ConfigError(
            f"{where}: 'python' must be 'module:function' (module.py in {folder}), got {spec!r}"
        )
    module_name, function_name = parts
    file = folder / f"{module_name}.py"
    if not file.is_file():
        raise ConfigError(f"{where}: no {file} for the Python step {spec!r}")
    # A name of its own per pipeline folder: two pipelines' steps.py must not collide.
    qualified = f"ferry_pipeline_{abs(hash(str(folder.resolve())))}_{module_name}"
    try:
        loader = importlib.util.spec_from_file_location(qualified, file)
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        sys.modules[qualified] = module  # dataclasses and pickling look the module up
        loader.loader.exec_module(module)
    except Exception as e:  # whatever the user's module raises on import
        sys.modules.pop(qualified, None)
        raise ConfigError(f"{where}: importing {file} failed: {type(e).__name__}: {e}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"{where}: {file} has no function {function_name!r}")
    return function


# -- Triton's ensemble config.pbtxt ---------------------------------------------------------------


def _from_ensemble(text: str, name: str, path: Path) -> PipelineSpec:
    from ferry.serving._pbtxt import triton_schema

    schema = triton_schema()
    message = schema.module.ModelConfig()
    try:
        schema.text_format.Parse(text, message)
    except schema.text_format.ParseError as e:
        raise ConfigError(f"{path} is not a valid Triton model configuration: {e}") from None
    where = str(path)
    if message.name and message.name != name:
        raise ConfigError(
            f"{where}: name {message.name!r} differs from its folder's {name!r}; make them equal"
        )
    if not message.HasField("ensemble_scheduling") or not message.ensemble_scheduling.step:
        raise ConfigError(f"{where}: an ensemble needs ensemble_scheduling {{ step [...] }}")
    enum = schema.module.DataType

    def decl(t: Any, kind: str) -> TensorDecl:
        type_name = enum.Name(t.data_type).removeprefix("TYPE_")
        datatype = "BYTES" if type_name == "STRING" else type_name
        return _tensor(t.name, datatype, list(t.dims), f"{where} {kind}")

    inputs = tuple(decl(t, "input") for t in message.input)
    outputs = tuple(decl(t, "output") for t in message.output)
    if not inputs or not outputs:
        raise ConfigError(f"{where}: an ensemble declares its 'input' and 'output' tensors")
    steps = []
    for number, raw in enumerate(message.ensemble_scheduling.step, 1):
        label = f"{where}: step {number}"
        if not raw.model_name:
            raise ConfigError(f"{label} has no model_name")
        if raw.model_version < -1 or raw.model_version == 0:
            raise ConfigError(f"{label}: model_version must be -1 (latest) or >= 1")
        steps.append(
            Step(
                number=number,
                name=raw.model_name,
                model=raw.model_name,
                version=None if raw.model_version == -1 else str(raw.model_version),
                python=None,
                function=None,
                inputs=_mapping(dict(raw.input_map), "input_map", label),
                outputs=_mapping(dict(raw.output_map), "output_map", label),
            )
        )
    return _checked(name, path, "ensemble", message.max_batch_size, inputs, outputs, steps)


# -- wiring ----------------------------------------------------------------------------------------


def _checked(
    name: str,
    path: Path,
    kind: str,
    max_batch: int,
    inputs: tuple[TensorDecl, ...],
    outputs: tuple[TensorDecl, ...],
    steps: list[Step],
) -> PipelineSpec:
    """Check the wiring: every tensor written once, every step's input written before it runs
    (by the request or a step), every output written; order the steps into waves."""
    where = str(path)
    for group, what in ((inputs, "input"), (outputs, "output")):
        names = [t.name for t in group]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise ConfigError(f"{where}: {what} {duplicate!r} is declared twice")
    writer: dict[str, str] = {t.name: "the request" for t in inputs}
    for step in steps:
        for tensor in step.outputs.values():
            if tensor in writer:
                raise ConfigError(
                    f"{where}: {step.label} writes {tensor!r}, which {writer[tensor]} already "
                    "writes; give it another name"
                )
            writer[tensor] = step.label
    for step in steps:
        for own, tensor in step.inputs.items():
            if tensor not in writer:
                raise ConfigError(
                    f"{where}: {step.label} reads {tensor!r} (as {own!r}), which neither the "
                    "request nor any step writes"
                )
    for out in outputs:
        if out.name not in writer or writer[out.name] == "the request":
            raise ConfigError(f"{where}: no step writes the pipeline's output {out.name!r}")
    waves: list[tuple[Step, ...]] = []
    ready = {t.name for t in inputs}
    left = list(steps)
    while left:
        wave = tuple(s for s in left if all(t in ready for t in s.inputs.values()))
        if not wave:
            raise ConfigError(
                f"{where}: steps {', '.join(s.label for s in left)} wait on each other (a cycle)"
            )
        waves.append(wave)
        for s in wave:
            ready.update(s.outputs.values())
        left = [s for s in left if s not in wave]
    return PipelineSpec(
        name=name,
        source=path,
        kind=kind,
        max_batch_size=max_batch,
        inputs=inputs,
        outputs=outputs,
        steps=tuple(steps),
        waves=tuple(waves),
    )


def as_json(spec: PipelineSpec) -> Mapping[str, Any]:
    """The steps as Triton's ``ensemble_scheduling`` (for ``/config``, in Triton's schema); a
    Python step's ``model_name`` is ``python:module:function``."""
    rows: list[dict[str, Any]] = []
    for step in spec.steps:
        row: dict[str, Any] = {
            "model_name": step.model if step.model is not None else f"python:{step.python}",
            "model_version": -1 if step.version is None else int(step.version),
        }
        row["input_map"] = dict(step.inputs)
        row["output_map"] = dict(step.outputs)
        rows.append(row)
    return {"step": rows}
