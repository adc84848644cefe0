"""PyTorch files, for the PyTorch converter: telling a torch.export archive, a TorchScript archive
and a ``torch.save`` checkpoint apart, loading them only when trusted (each loader can run code
embedded in the file), and saying what an untrusted checkpoint holds by reading its pickle's
opcodes, which executes nothing.
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ferry.converters._base import ConvertOptions, first_line
from ferry.converters._pytorch_export import _import_torch, _quiet_exporter
from ferry.errors import ModelLoadError

if TYPE_CHECKING:
    pass

__all__: list[str] = []

#: ``torch.save``'s legacy (non-zip) format: pickle protocol 2, then this magic number as a long.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
#: Modules whose globals a weights-only checkpoint references (tensor rebuilders, storages, dtypes,
#: OrderedDict); any other global in the pickle is a Python object such as an ``nn.Module``.
_WEIGHTS_ONLY_MODULES = ("torch._utils", "torch.storage")
_WEIGHTS_ONLY_GLOBALS = frozenset(
    {
        "collections.OrderedDict",
        "_codecs.encode",  # bytes under pickle protocol 2
        *(
            f"{module}.{name}"
            # pickle protocol 2 spells builtins "__builtin__"
            for module in ("builtins", "__builtin__")
            for name in ("set", "frozenset", "slice", "bytearray", "complex")
        ),
    }
)
_FileKind = Literal["pt2", "torchscript", "checkpoint"]


def _file_kind(path: Path) -> _FileKind | None:
    """What a torch file is, from its zip layout or magic bytes (nothing is unpickled)."""
    try:
        if not path.is_file():
            return None
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return _zip_kind(archive.namelist())
        with path.open("rb") as f:
            head = f.read(len(_LEGACY_MAGIC))
    except (OSError, zipfile.BadZipFile):
        return None
    return "checkpoint" if head == _LEGACY_MAGIC else None


def _zip_kind(names: list[str]) -> _FileKind | None:
    # Every torch archive keeps its entries under one top-level folder (named after the file).
    inner = {name.split("/", 1)[1] for name in names if "/" in name}
    if "archive_format" in inner or any(
        n.startswith("models/") and n.endswith(".json") for n in inner
    ):
        return "pt2"
    if "constants.pkl" in inner or any(n.startswith("code/") for n in inner):
        return "torchscript"
    if "data.pkl" in inner:
        return "checkpoint"
    return None


def _load_archive(
    path: Path, options: ConvertOptions, what: str, loader: str, load: Callable[[], Any]
) -> Any:
    """``load()`` a torch archive (``what``, read by ``loader``), if the user trusts the file."""
    if not options.trust_pickle:
        raise ModelLoadError(
            f"{path} is {what}; {loader} unpickles data that can run arbitrary code, so ferry "
            "loads it only if you trust the file: pass --trust-pickle (trust_pickle=True)"
        )
    try:
        with _quiet_exporter():
            return load()
    except Exception as e:  # corrupt archive, newer torch, unknown custom op classes...
        raise ModelLoadError(f"cannot load {path} with {loader}: {first_line(e)}") from e


def _load_checkpoint(path: Path, options: ConvertOptions) -> tuple[Any, list[str]]:
    """Unpickle a torch.save file (trust_pickle only) and return the model inside."""
    torch = _import_torch()
    globals_ = _pickle_globals(path)
    python_objects = sorted(g for g in globals_ if not _weights_only_global(g))
    if globals_ and not python_objects:
        # Only tensors, dicts and numbers (what torch's weights-only loader accepts): no model
        # in there, whatever the trust. Nothing was unpickled to find out.
        raise ModelLoadError(_state_dict_message(path))
    if not options.trust_pickle:
        held = ""
        if python_objects:
            more = ", ..." if len(python_objects) > 3 else ""
            held = f" ({', '.join(python_objects[:3])}{more})"
        raise ModelLoadError(
            f"{path} is a pickled checkpoint holding Python objects{held}; "
            "unpickling it can run arbitrary code, so ferry loads it only if you trust the "
            "file: pass --trust-pickle (trust_pickle=True)"
        )
    try:
        with _quiet_exporter():
            obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a missing class (defined in a script that is not imported)...
        raise ModelLoadError(
            f"cannot unpickle {path}: {first_line(e)}. The model's class must be importable "
            "(import the module that defines it first, or pass the module object itself)"
        ) from e
    notes = [f"unpickled {path.name} with torch.load (trust_pickle)"]
    if isinstance(obj, (torch.nn.Module, torch.export.ExportedProgram)):
        return obj, notes
    if isinstance(obj, Mapping):
        models = [(k, v) for k, v in obj.items() if isinstance(v, torch.nn.Module)]
        if len(models) == 1:
            notes.append(f"converted the module under key {models[0][0]!r} of the checkpoint")
            return models[0][1], notes
        if all(isinstance(v, (torch.Tensor, Mapping, int, float, str)) for v in obj.values()):
            raise ModelLoadError(_state_dict_message(path))
    raise ModelLoadError(
        f"{path} holds a {type(obj).__module__}.{type(obj).__qualname__}, not a model: save the "
        "nn.Module itself (torch.save(model)), a torch.export program (.pt2) or TorchScript"
    )


def _state_dict_message(path: Path) -> str:
    return (
        f"{path} holds weights only (a state_dict), not a model: a state_dict needs the model's "
        "Python class. Build the model, load_state_dict() the weights, and convert the module "
        "with the Python API: ferry.convert(model, example_inputs=...)"
    )


def _pickle_globals(path: Path) -> set[str]:
    """The ``module.name`` globals a torch.save pickle references, read from its opcodes without
    running it (so nothing in the file executes)."""
    found: set[str] = set()
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                entry = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
                _scan_pickle(io.BytesIO(archive.read(entry)), found)
        else:
            # The legacy format is several pickles in a row (magic, version, system info,
            # the object, storage keys) followed by raw storage bytes.
            with path.open("rb") as f:
                for _ in range(5):
                    _scan_pickle(f, found)
    except (OSError, StopIteration, ValueError, zipfile.BadZipFile):
        pass  # unreadable parts: what was found so far (possibly nothing) decides
    return found


def _scan_pickle(stream: Any, found: set[str]) -> None:
    strings: list[str] = []
    memo: dict[int, str] = {}
    for opcode, arg, _ in pickletools.genops(stream):
        name = opcode.name
        if name in ("GLOBAL", "INST") and isinstance(arg, str):
            found.add(".".join(arg.split(" ", 1)) if " " in arg else arg.replace("\n", "."))
        elif name == "STACK_GLOBAL" and len(strings) >= 2:
            found.add(f"{strings[-2]}.{strings[-1]}")
        elif isinstance(arg, str) and "UNICODE" in name:
            strings.append(arg)
        elif name == "MEMOIZE" and strings:
            memo[len(memo)] = strings[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET") and isinstance(arg, int) and arg in memo:
            strings.append(memo[arg])
        if name == "STOP":
            return


def _weights_only_global(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    if name in _WEIGHTS_ONLY_GLOBALS or module.startswith(_WEIGHTS_ONLY_MODULES):
        return True
    # torch.FloatStorage, torch.float32, torch.Size, torch.device...
    return module == "torch" and (
        attr.endswith("Storage") or attr in {"Size", "device"} or attr.islower()
    )
