"""The engine cache: compiled partitions on disk, so that a model compiles once per machine.

An entry is keyed by the sha256 of everything that decides what an engine builds: the lowered
partition's graph structure (serialized with its weights left out), the weights' bytes (hashed
tensor by tensor, streamed from external data files for big models), the backend's name, device and
version, the compile options and the partition's input specs. It lives in
``${FERRY_CACHE_DIR:-~/.cache/ferry}/engines/<key>/`` as ``engine.bin`` (what
``CompiledPartition.serialize()`` gave) and ``meta.json`` (what it is, and the blob's size and
sha256 to catch a damaged file).

Entries are written into a temporary folder and renamed into place, so a reader never sees half an
entry. A process about to compile a partition the cache lacks holds a lock on its key (an advisory
file lock, ``engines/.lock-<key>``): another process, or another Ray Serve replica on the node,
wanting the same engine waits for it and then loads the stored entry, so an engine is compiled
once per machine, not once per process. Readers hold the same lock shared, and eviction passes
over an entry whose lock is held, so an entry is never removed while it is read. A damaged entry (unreadable meta, a blob of the wrong size or hash, or one the backend fails to load)
is discarded and rebuilt. The cache keeps under a size cap (``FERRY_CACHE_MAX_BYTES``, default
20 GiB) by evicting the least recently used entries. Backends that compile in-process from the
model and have nothing to store (ONNX Runtime) are never hashed at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import platform
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import onnx_ir as ir

from ferry._version import __version__
from ferry.errors import FerryError

if TYPE_CHECKING:
    from ferry.backends import Backend, CompiledPartition, CompileSpec

__all__ = [
    "DEFAULT_MAX_BYTES",
    "CacheEntry",
    "EngineCache",
    "compile_partition",
    "default_cache_dir",
    "engine_key",
    "model_digest",
    "remember_inputs",
    "remembered_inputs",
    "resolve_cache",
]

logger = logging.getLogger(__name__)

#: Bumped whenever what goes into a key or an entry changes: old entries then simply miss.
CACHE_FORMAT = 1

#: Size cap of the engine cache unless ``FERRY_CACHE_MAX_BYTES`` or ``max_bytes`` says otherwise.
DEFAULT_MAX_BYTES = 20 << 30

_BLOB = "engine.bin"
_META = "meta.json"
_TMP_PREFIX = ".tmp-"
_LOCK_PREFIX = ".lock-"
# A temporary folder this old belongs to a writer that died; anything younger may still be written.
_STALE_TMP_S = 3600.0
_CHUNK = 8 << 20

# (backend, version) pairs seen returning an empty blob in this process: no point hashing for them.
_EMPTY_BLOB_BACKENDS: set[tuple[str, str]] = set()


def default_cache_dir() -> Path:
    """``$FERRY_CACHE_DIR``, else ``~/.cache/ferry`` (``$XDG_CACHE_HOME/ferry`` when set)."""
    env = os.environ.get("FERRY_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "ferry"


def resolve_cache(
    cache_dir: str | os.PathLike[str] | Literal[False] | None,
) -> EngineCache | None:
    """The cache that ``ferry.load(cache_dir=...)`` asks for: None -> the default, False -> none."""
    if cache_dir is False:
        return None
    if cache_dir is None:
        return EngineCache(default_cache_dir())
    if cache_dir is True or not isinstance(cache_dir, (str, os.PathLike)):
        raise FerryError(
            f"cache_dir must be a folder, None (the default cache) or False (no cache), "
            f"got {cache_dir!r}"
        )
    return EngineCache(Path(cache_dir).expanduser())


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One stored engine, as listed by :meth:`EngineCache.entries`."""

    key: str
    path: Path
    size: int
    last_used: float
    meta: dict[str, Any]


class EngineCache:
    """Compiled partitions on disk under ``root/engines/<key>/``.

    Every method is safe to call from several threads and processes at once. Failures to write
    (a read-only or full disk) are logged and otherwise ignored: the cache only ever saves time.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.engines = self.root / "engines"
        if max_bytes is None:
            env = os.environ.get("FERRY_CACHE_MAX_BYTES")
            try:
                max_bytes = int(env) if env else DEFAULT_MAX_BYTES
            except ValueError:
                raise FerryError(
                    f"FERRY_CACHE_MAX_BYTES must be a whole number of bytes, got {env!r}"
                ) from None
        #: Size cap in bytes; least recently used entries go when a new one would pass it.
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"EngineCache({str(self.root)!r}, max_bytes={self.max_bytes})"

    def path(self, key: str) -> Path:
        """The folder of ``key``'s entry (which may not exist)."""
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise FerryError(f"not an engine cache key: {key!r}")
        return self.engines / key

    def get(self, key: str) -> bytes | None:
        """The stored blob for ``key``, or None when there is none or it is damaged (then removed).

        Read under the key's shared lock, so that eviction leaves the entry alone meanwhile.
        """
        with self._hold(key, exclusive=False):
            return self._read(key)

    def _read(self, key: str) -> bytes | None:
        """:meth:`get` for a caller that holds the key's lock already."""
        entry = self.path(key)
        try:
            meta = json.loads((entry / _META).read_text(encoding="utf-8"))
            blob = (entry / _BLOB).read_bytes()
        except FileNotFoundError:
            if entry.exists():
                self._discard(entry, "an incomplete entry")
            return None
        except (OSError, ValueError) as e:
            self._discard(entry, f"an unreadable entry ({e})")
            return None
        if (
            not isinstance(meta, dict)
            or meta.get("format") != CACHE_FORMAT
            or meta.get("blob_bytes") != len(blob)
            or meta.get("blob_sha256") != hashlib.sha256(blob).hexdigest()
        ):
            self._discard(entry, "a damaged entry (its blob does not match its meta.json)")
            return None
        with contextlib.suppress(OSError):
            os.utime(entry / _META)  # the LRU clock: eviction goes by meta.json's mtime
        return blob

    def put(self, key: str, blob: bytes, meta: Mapping[str, Any] | None = None) -> Path | None:
        """Store ``blob`` under ``key`` atomically; return the entry's folder (None if not written)."""
        entry = self.path(key)
        record = {
            **dict(meta or {}),
            "format": CACHE_FORMAT,
            "key": key,
            "blob_bytes": len(blob),
            "blob_sha256": hashlib.sha256(blob).hexdigest(),
            "created": time.time(),
            "ferry_version": __version__,
        }
        tmp = self.engines / f"{_TMP_PREFIX}{key[:16]}-{uuid.uuid4().hex}"
        try:
            tmp.mkdir(parents=True)
            _write(tmp / _BLOB, blob)
            _write(tmp / _META, json.dumps(record, indent=2, default=str).encode())
            try:
                tmp.rename(entry)
            except OSError:
                if not entry.exists():
                    raise
                # Someone stored the same key meanwhile; theirs is as good as ours.
                logger.debug("engine cache: %s was stored concurrently", key[:12])
        except OSError as e:
            logger.warning("engine cache: cannot write %s (%s); continuing without it", entry, e)
            return None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.evict(keep=key)
        return entry

    def building(self, key: str) -> contextlib.AbstractContextManager[bool]:
        """Hold ``key``'s lock exclusively while its engine is built (waits for readers and for
        another builder, whose entry the caller should then look for again)."""
        return self._hold(key, exclusive=True)

    @contextlib.contextmanager
    def _hold(self, key: str, *, exclusive: bool, wait: bool = True) -> Iterator[bool]:
        """Hold ``key``'s lock (``engines/.lock-<key>``): shared by readers, exclusive for a
        builder or eviction. Yields False when ``wait`` is off and another holds it.

        Where file locks are missing (not POSIX) or the lock file cannot be made (a read-only
        cache), nothing is held (True): two builders then both compile, one entry results, and
        a reader whose entry is evicted meanwhile sees a miss.
        """
        try:
            import fcntl
        except ImportError:  # Windows
            yield True
            return
        lock = self.engines / f"{_LOCK_PREFIX}{self.path(key).name}"
        try:
            self.engines.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            logger.debug("engine cache: no lock for %s (%s)", key[:12], e)
            yield True
            return
        try:
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            try:
                fcntl.flock(fd, mode if wait else mode | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing releases the lock; the file stays for the next holder

    def discard(self, key: str) -> None:
        """Remove ``key``'s entry, if any."""
        entry = self.path(key)
        if entry.exists():
            self._discard(entry, "on request")

    def entries(self) -> list[CacheEntry]:
        """Every complete entry, least recently used first."""
        found = []
        for entry in self._entry_dirs():
            try:
                meta_path = entry / _META
                last_used = meta_path.stat().st_mtime
                size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # being written or removed right now, or damaged: get() deals with it
            found.append(CacheEntry(entry.name, entry, size, last_used, meta))
        found.sort(key=lambda e: e.last_used)
        return found

    def size(self) -> int:
        """Bytes held by complete entries."""
        return sum(e.size for e in self.entries())

    def evict(self, *, keep: str | None = None) -> list[str]:
        """Remove least recently used entries until the cache fits ``max_bytes``; return their keys.

        An entry being read or built (its key's lock held) is passed over. Also clears temporary folders left by writers that died.
        """
        removed: list[str] = []
        with self._lock:
            self._clear_stale_tmp()
            entries = self.entries()
            total = sum(e.size for e in entries)
            for e in entries:
                if total <= self.max_bytes:
                    break
                if e.key == keep:
                    continue
                with self._hold(e.key, exclusive=True, wait=False) as free:
                    if not free:  # being read or rebuilt right now: the next one goes instead
                        continue
                    self._discard(e.path, "to stay under the size cap (least recently used)")
                total -= e.size
                removed.append(e.key)
        return removed

    def clear(self) -> None:
        """Remove every entry."""
        for entry in self._entry_dirs():
            self._discard(entry, "on clear")

    def _entry_dirs(self) -> Iterator[Path]:
        try:
            children = list(self.engines.iterdir())
        except OSError:
            return
        for child in children:
            if len(child.name) == 64 and child.is_dir():
                yield child

    def _discard(self, entry: Path, why: str) -> None:
        logger.info("engine cache: removing %s: %s", entry.name[:12], why)
        # Rename first so that no reader ever sees a half-removed entry under the key's name.
        trash = entry.with_name(f"{_TMP_PREFIX}gone-{uuid.uuid4().hex}")
        try:
            entry.rename(trash)
        except OSError:
            return  # already gone (another process discarded it first)
        shutil.rmtree(trash, ignore_errors=True)

    def _clear_stale_tmp(self) -> None:
        try:
            children = list(self.engines.iterdir())
        except OSError:
            return
        now = time.time()
        for child in children:
            if not child.name.startswith(_TMP_PREFIX):
                continue
            try:
                old = now - child.stat().st_mtime > _STALE_TMP_S
            except OSError:
                continue
            if old:
                shutil.rmtree(child, ignore_errors=True)


def _write(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())  # the rename that publishes the entry must not outrun its content


# ---------------------------------------------------------------------------------------------
# Keys


def engine_key(backend: Backend, spec: CompileSpec) -> str:
    """The cache key (64 hex digits) of compiling ``spec`` on ``backend``.

    It changes with the graph (ops, attributes, names, declared shapes), any weight byte, the
    backend's name, device, version and ``cache_fingerprint()`` (when it has one), the host's OS
    and architecture, any option, and the partition's input specs.
    """
    model = spec.model
    digest = hashlib.sha256()
    header = {
        "format": CACHE_FORMAT,
        "backend": backend.name,
        "device": backend.device,
        "version": backend.version,
        # Engines are built for the hardware they run on (TensorRT for one GPU model, OpenVINO
        # for one CPU's instruction set): a cache folder shared between machines must not mix them.
        "host": [platform.system(), platform.machine()],
        "fingerprint": _fingerprint(backend),
        "options": _jsonable(dict(spec.options)),
        "partition_options": _jsonable(dict(spec.partition.options)),
        "inputs": [_value_spec(v) for v in model.graph.inputs],
        "outputs": [_value_spec(v) for v in model.graph.outputs],
    }
    _update(digest, json.dumps(header, sort_keys=True).encode())
    _hash_graph(digest, model)
    return digest.hexdigest()


def _hash_graph(digest: Any, model: ir.Model) -> None:
    """Feed ``model``'s structure and every weight (name, dtype, shape, bytes) into ``digest``."""
    structure, tensors = _structure(model)
    _update(digest, structure)
    for name, tensor in tensors:
        _update(digest, f"{name}|{tensor.dtype}|{list(tensor.shape)}".encode())
        _hash_tensor(digest, tensor)


def _fingerprint(backend: Backend) -> str:
    """What the backend says its engines depend on beyond its version (GPU model, driver...)."""
    return str(backend.cache_fingerprint())


def _update(digest: Any, data: bytes) -> None:
    # Length-prefixed, so that no two different sequences of parts hash alike.
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)


def _value_spec(value: ir.Value) -> list[Any]:
    shape = None if value.shape is None else [str(d) for d in value.shape]
    return [value.name, str(value.type), shape]


def _jsonable(options: dict[str, Any]) -> Any:
    return json.loads(json.dumps(options, sort_keys=True, default=repr))


def _structure(model: ir.Model) -> tuple[bytes, list[tuple[str, ir.TensorProtocol]]]:
    """The model serialized without its top-level weights, and those weights in graph order.

    The graph is serialized through a view that lists no initializers (their names, types and
    shapes are hashed with their bytes instead), so the cost is the graph's size, not the weights',
    and nothing is cloned. Weights inside If/Loop/Scan bodies are serialized with their body: they
    are rare and small.
    """
    graph = model.graph
    view = ir.GraphView(
        graph.inputs,
        graph.outputs,
        nodes=graph,
        opset_imports=dict(graph.opset_imports),
        name=graph.name,
        doc_string=graph.doc_string,
    )
    shell = ir.Model(
        view,  # type: ignore[arg-type]  # onnx_ir serializes a GraphView like a Graph
        ir_version=model.ir_version,
        domain=model.domain,
        model_version=model.model_version,
        functions=list(model.functions.values()),
    )
    tensors = [
        (name, value.const_value)
        for name, value in graph.initializers.items()
        if value.const_value is not None
    ]
    return ir.to_proto(shell).SerializeToString(deterministic=True), tensors


def _hash_tensor(digest: Any, tensor: ir.TensorProtocol) -> None:
    """Feed a tensor's bytes to ``digest`` without copying them where that can be avoided."""
    if isinstance(tensor, ir.ExternalTensor):
        path = Path(tensor.base_dir) / tensor.location
        remaining = tensor.length if tensor.length is not None else tensor.nbytes
        try:
            with path.open("rb") as f:
                f.seek(tensor.offset or 0)
                while remaining > 0:
                    chunk = f.read(min(_CHUNK, remaining))
                    if not chunk:
                        break
                    digest.update(chunk)
                    remaining -= len(chunk)
        except OSError as e:
            raise FerryError(
                f"cannot read weight {tensor.name!r} from external data file {path}: {e}"
            ) from e
        return
    if isinstance(tensor, ir.Tensor) and tensor.dtype != ir.DataType.STRING:
        array = np.asarray(tensor.numpy())
        if array.dtype != object:
            # A flat byte view of a contiguous array: hashed in place, whatever its element type.
            flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            digest.update(flat.data)
            return
    digest.update(tensor.tobytes())


# ---------------------------------------------------------------------------------------------
# Compiling through the cache


def caches_engines(backend: Backend) -> bool:
    """Whether ``backend`` may give a blob worth storing (and so whether to hash at all)."""
    # False for engines that build from the model every time (ONNX Runtime); None: not known.
    flag = backend.engine_cache
    if flag is not None:
        return flag
    return (backend.name, backend.version) not in _EMPTY_BLOB_BACKENDS


def compile_partition(
    backend: Backend, spec: CompileSpec, cache: EngineCache | None
) -> tuple[CompiledPartition, str]:
    """Compile ``spec`` on ``backend``, through ``cache`` when there is one.

    Returns:
        The compiled partition and how it was obtained: ``"loaded"`` (from the cache),
        ``"compiled"`` (and stored), or ``"uncached"`` (no cache, or nothing to store).
    """
    if cache is None or not caches_engines(backend):
        return backend.compile(spec), "uncached"
    started = time.perf_counter()
    key = engine_key(backend, spec)
    hashed = time.perf_counter() - started
    compiled = _load_cached(backend, spec, cache, key, hashed)
    if compiled is not None:
        return compiled, "loaded"
    with cache.building(key):
        # Whoever held the lock before us may have stored this very engine meanwhile.
        compiled = _load_cached(backend, spec, cache, key, hashed, locked=True)
        if compiled is not None:
            return compiled, "loaded"
        compiled = backend.compile(spec)
        blob = compiled.serialize()
        if not blob:
            _EMPTY_BLOB_BACKENDS.add((backend.name, backend.version))
            return compiled, "uncached"
        cache.put(
            key,
            blob,
            {
                "backend": backend.name,
                "backend_version": backend.version,
                "device": backend.device,
                "nodes": len(spec.partition.nodes),
                "options": _jsonable(dict(spec.options)),
                "inputs": [_value_spec(v) for v in spec.model.graph.inputs],
            },
        )
    logger.debug("engine cache: stored %s engine as %s", backend.name, key[:12])
    return compiled, "compiled"


def _load_cached(
    backend: Backend,
    spec: CompileSpec,
    cache: EngineCache,
    key: str,
    hashed: float,
    *,
    locked: bool = False,
) -> CompiledPartition | None:
    """The engine stored under ``key``, or None (none stored, or it does not load: discarded).
    ``locked``: the caller holds the key's lock."""
    blob = cache._read(key) if locked else cache.get(key)
    if blob is None:
        return None
    try:
        compiled = backend.load(blob, spec)
    except Exception as e:  # any engine's own error type: the blob is useless either way
        logger.warning(
            "engine cache: %s could not load its cached engine %s (%s); recompiling",
            backend.name,
            key[:12],
            e,
        )
        cache.discard(key)
        return None
    logger.debug(
        "engine cache: loaded %s from %s (hashing took %.3fs)", backend.name, key[:12], hashed
    )
    return compiled


# ---------------------------------------------------------------------------------------------
# What the model was found to run on (``ferry.runtime.found_inputs``)

_ARTIFACT_REPORT = "ferry.json"
_FOUND_FIELD = "found_inputs"


def model_digest(model: ir.Model) -> str:
    """A sha256 of ``model``'s content (graph, declared specs and every weight byte): the key
    found inputs are cached by in one process."""
    digest = hashlib.sha256()
    specs = [_value_spec(v) for v in [*model.graph.inputs, *model.graph.outputs]]
    _update(digest, json.dumps(specs).encode())
    _hash_graph(digest, model)
    return digest.hexdigest()


def remembered_inputs(model_file: Path) -> dict[str, tuple[int, ...]] | None:
    """The input shapes found to run the artifact's model (``ferry.json``'s
    ``"found_inputs"``), or None when it remembers none."""
    report = Path(model_file).parent / _ARTIFACT_REPORT
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        found = data[_FOUND_FIELD]
        if found.get("model") != Path(model_file).name:
            return None
        return {str(k): tuple(int(d) for d in v) for k, v in found["shapes"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def remember_inputs(model_file: Path, shapes: Mapping[str, tuple[int, ...]], how: str) -> None:
    """Record in the artifact's ``ferry.json`` the shapes the model was found to run at, so that
    later verbs start from them. Only an artifact ferry made (its ``ferry.json`` exists) is
    written; any failure to write is logged, never raised (remembering is an optimization)."""
    report = Path(model_file).parent / _ARTIFACT_REPORT
    if not report.is_file():
        return
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            return
        entry = {"model": Path(model_file).name, "shapes": {k: list(v) for k, v in shapes.items()}}
        if {k: v for k, v in (data.get(_FOUND_FIELD) or {}).items() if k != "how"} == entry:
            return
        data[_FOUND_FIELD] = {**entry, "how": how}
        from ferry.graph import atomic_path

        with atomic_path(report) as tmp:
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    except (OSError, ValueError) as e:
        logger.debug("not remembering the inputs found in %s: %s", report, e)
