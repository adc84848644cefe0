"""The model repository: Triton's folder layout, version policies, loading, unloading and hot reload.

Layout::

    REPO/
      <model>/
        config.json            optional (see ferry.serving._config); or Triton's config.pbtxt
        <version>/             an integer: 1, 2, 3...
          model.onnx           or the one *.onnx file, or one artifact folder holding model.onnx
                               (or the config's default_model_filename)

A single ``.onnx`` file or artifact folder is served as a repository of one model, named after the
file's stem (the folder's name), version 1.

Modes: by default every model loads at start; ``explicit`` loads only the models named in ``load``
and then what ``POST /v2/repository/models/{m}/load`` asks for; ``poll_interval`` rescans the
repository that often, loading new models and versions, reloading changed ones and unloading removed
ones. A model's (re)load happens in the background: its versions keep serving until the new ones are
loaded and warmed up, then the routing switches in one step (on the event loop, so no request sees a
half-switched model) and the versions it replaced finish their in-flight requests before they are
dropped. A load that fails keeps what was serving and is reported by :meth:`ModelRepository.index`.

A version is READY once it loaded and its warm-up passed; :meth:`ModelRepository.unready` says what
keeps the repository from being all READY (Triton's strict readiness).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ferry.errors import FerryError, InvalidInputError, ModelLoadError
from ferry.generate import is_generative_artifact
from ferry.runtime import check_placement
from ferry.serving._admission import DEFAULT_MAX_QUEUE_SIZE, check_max_queue_size
from ferry.serving._config import (
    ConfigError,
    ModelConfig,
    check_optimize,
    check_precision,
    parse_config,
)
from ferry.serving._config_file import read_config
from ferry.serving._declared import DeclaredVersion
from ferry.serving._generative import GenerationSettings, GenerativeVersion, load_generative
from ferry.serving._isolate import down_reason, gave_up, load_isolated
from ferry.serving._metrics import Metrics, VersionRecorder
from ferry.serving._pipeline import is_pipeline_file, load_pipeline, pipeline_down, pipeline_files
from ferry.serving._repository_files import (
    NO_MODELS_HINT,
    ModelNotFoundError,
    ModelNotReadyError,
    VersionFiles,
    check_model_name,
    find_model_file,
    fingerprint,
    list_models,
    model_name_for,
    source_models,
)
from ferry.serving._scheduler import ModelVersion, available_cores, load_version

__all__ = [
    "NO_MODELS_HINT",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "ModelRepository",
    "VersionFiles",
    "check_model_name",
    "find_model_file",
    "list_models",
    "model_name_for",
    "source_models",
]

logger = logging.getLogger(__name__)

READY = "READY"
LOADING = "LOADING"
UNAVAILABLE = "UNAVAILABLE"


#: A model name is a plain folder name: no separators, no leading dot, so never ``..``.
@dataclasses.dataclass
class _Scan:
    config: ModelConfig | None = None
    config_key: str | None = None  # the config's text: a change means every version reloads
    versions: dict[int, VersionFiles] = dataclasses.field(default_factory=dict)
    error: str | None = None
    gone: bool = False


@dataclasses.dataclass
class _Entry:
    name: str
    serving: dict[int, ModelVersion] = dataclasses.field(default_factory=dict)
    states: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
    fingerprints: dict[int, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    failed: dict[int, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    config_key: str | None = None
    warned_key: str | None = None  # the config whose warnings were logged
    override: dict[str, Any] | None = None
    error: str | None = None
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class ModelRepository:
    """The models a server serves, and their lifecycle (use it on the event loop).

    Args:
        source: a repository folder, a model file or an artifact folder.
        backends: engines for models whose config.json names none (None: ONNX Runtime).
        optimize: the optimization level for models whose config names none (``"basic"``,
            ``"extended"``; None or ``"none"``: none).
        precision: the precision for models whose config.json names none (None: each engine's
            default, fp32); one of :data:`ferry.serving.PRECISIONS`.
        poll_interval: rescan the repository every this many seconds (None: never).
        explicit: load only ``load`` at start; then only what load requests ask for.
        load: models to load at start in explicit mode.
        warmup: run each instance once before a version reports ready.
        metrics: where the versions' metrics go.
        batcher: makes each batching version's batcher (see :class:`ModelVersion`).
        generation: how generative artifacts are served (continuous batching settings).
        threads: engine threads per instance, one instance per version unless its config says
            (see :func:`load_version`); None: the cores shared out.
        placement: ``"live"`` or ``"fixed"`` for models whose config names none (None: live;
            see ``ferry.load``).
        isolate: run every model's instances in worker processes (:mod:`ferry.serving._isolate`;
            a config's ``"isolate"`` asks it for one model).
        max_queue_size: requests a version may hold waiting, for configs without a limit (0:
            none; see :mod:`ferry.serving._admission`).

    Raises:
        ModelLoadError: the source does not exist or is not a model, artifact or repository.
        InvalidInputError: contradictory options (explicit with polling, unknown names in ``load``).
    """

    def __init__(
        self,
        source: str | os.PathLike[str],
        *,
        backends: str | Sequence[str] | None = None,
        precision: str | None = None,
        optimize: str | None = None,
        poll_interval: float | None = None,
        explicit: bool = False,
        load: Sequence[str] | None = None,
        warmup: bool = True,
        metrics: Metrics | None = None,
        batcher: Callable[..., Any] | None = None,
        threads: int | None = None,
        generation: GenerationSettings | None = None,
        placement: str | None = None,
        isolate: bool = False,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
    ) -> None:
        path = Path(source)
        if placement is not None:
            check_placement(placement)
        if precision is not None:
            check_precision(precision)
        if optimize is not None:
            check_optimize(optimize)
        if not path.exists():
            raise ModelLoadError(f"model or repository not found: {path}")
        if poll_interval is not None and not poll_interval > 0:
            raise InvalidInputError(f"poll interval must be positive seconds, got {poll_interval}")
        if explicit and poll_interval is not None:
            raise InvalidInputError(
                "explicit mode and polling exclude each other: either the load API or the "
                "repository's files decide what is served"
            )
        self.backends = backends  # parsed when a model loads (ferry.backends.parse_backends)
        self.precision = precision
        self.optimize = optimize
        self.placement = placement
        self.isolate = isolate
        #: Requests a version may hold waiting when its config says no limit (0: none).
        self.max_queue_size = check_max_queue_size(max_queue_size)
        self.poll_interval = poll_interval
        self.explicit = explicit
        self.warmup = warmup
        self.batcher = batcher
        if threads is not None and (type(threads) is not int or threads < 1):
            raise InvalidInputError(f"threads must be a positive integer, got {threads!r}")
        self.threads = threads
        #: How generative artifacts are served (continuous batching settings).
        self.generation = generation or GenerationSettings()
        self.metrics = metrics
        self.source = path
        self.root: Path | None = None
        self.single: tuple[str, Path] | None = None
        single, names = source_models(path)
        if single:
            self.single = (names[0], path)
        else:
            self.root = path
            if not names and not explicit and poll_interval is None:
                raise ModelLoadError(f"no models in {path}: {NO_MODELS_HINT}")
        self.load_at_start = list(load or [])
        for name in self.load_at_start:
            check_model_name(name)
            if name not in names:
                raise InvalidInputError(
                    f"cannot load {name!r} at start: no such model in {path}; it has "
                    f"{', '.join(names) or 'no models'}"
                )
        self._entries: dict[str, _Entry] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._loader: ThreadPoolExecutor | None = None
        #: True once the models asked for at start have been tried (loaded or failed).
        self.started = False
        self.stopping = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the start-up models, then begin polling if asked to."""
        self._loader = ThreadPoolExecutor(
            max(1, min(4, available_cores())), thread_name_prefix="ferry-load"
        )
        if self.explicit:
            names = self.load_at_start
        else:
            names = await self._run_blocking(self._list_names)
        await asyncio.gather(*(self._sync(name) for name in names))
        self.started = True
        if self.poll_interval is not None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        """Stop polling, let every version finish its in-flight requests, release everything."""
        self.stopping = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        for entry in self._entries.values():
            async with entry.lock:
                for version in entry.serving.values():
                    self._retire(version)
                entry.serving = {}
        if self._retiring:
            await asyncio.gather(*list(self._retiring), return_exceptions=True)
        if self._loader is not None:
            self._loader.shutdown(wait=False)

    async def _poll(self) -> None:
        assert self.poll_interval is not None
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.poll_once()
            except Exception:
                logger.exception("polling the model repository failed")

    async def poll_once(self) -> None:
        """Rescan the repository once: load what is new or changed, unload what is gone."""
        names = set(await self._run_blocking(self._list_names)) | set(self._entries)
        for name in sorted(names):
            await self._sync(name)

    # -- the load and unload API ----------------------------------------------------------------

    async def load(self, name: str, config: dict[str, Any] | None = None) -> None:
        """Load or reload a model (with ``config`` in place of its config.json, when given).

        Raises:
            ModelNotFoundError: no such model folder.
            ModelLoadError: the model failed to load (what was serving before keeps serving).
        """
        check_model_name(name)
        if self.poll_interval is not None:
            raise InvalidInputError(
                "this server polls its repository for changes; change the files instead of "
                "using the load API"
            )
        if not await self._run_blocking(self._exists, name):
            entry = self._entries.get(name)
            if entry is not None:
                await self._sync(name)  # the folder went away: unload what it served
            raise ModelNotFoundError(f"no model {name!r} in the repository {self.source}")
        if config is not None:
            parse_config(config, name, source="the load request's config")  # fail before loading
        await self._sync(name, override=config, retry=True)
        entry = self._entries[name]
        if entry.error is not None:
            raise ModelLoadError(f"failed to load {name!r}: {entry.error}")
        failures = [
            f"version {v}: {entry.states[v][1]}" for v in sorted(entry.failed) if v in entry.states
        ]
        if not entry.serving or failures:
            raise ModelLoadError(
                f"failed to load {name!r}: {'; '.join(failures) or 'no version could be loaded'}"
            )

    async def unload(self, name: str) -> None:
        """Stop serving a model; its in-flight requests finish first.

        Raises:
            ModelNotFoundError: no such model.
        """
        check_model_name(name)
        if self.poll_interval is not None:
            raise InvalidInputError(
                "this server polls its repository for changes; remove the model's folder "
                "instead of using the unload API"
            )
        entry = self._entries.get(name)
        if entry is None:
            if await self._run_blocking(self._exists, name):
                return  # known but not loaded: nothing to do
            raise ModelNotFoundError(f"no model {name!r} in the repository {self.source}")
        async with entry.lock:
            self._unload_entry(entry, "unloaded")
            for number in entry.states:  # failed versions too: nothing of it should load now
                entry.states[number] = (UNAVAILABLE, "unloaded")
            entry.error = None
            entry.override = None
            entry.config_key = None
            entry.fingerprints.clear()
            entry.failed.clear()

    # -- lookups ----------------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The version that serves a request (the highest serving one when ``version`` is None).

        Raises:
            InvalidInputError: a malformed name or version (400).
            ModelNotFoundError: no such model or version (404).
            ModelNotReadyError: known, but not serving now (503).
        """
        entry = self._entries.get(name)
        if entry is None:
            check_model_name(name)
            if self._exists(name):
                raise ModelNotReadyError(f"model {name!r} is not loaded")
            raise ModelNotFoundError(f"unknown model {name!r}")
        if version is None or version == "":
            serving = entry.serving
            if serving:
                return _up(name, serving[max(serving)])
            raise ModelNotReadyError(f"model {name!r} is not ready: {self._why_not(entry)}")
        if not version.isdigit():
            raise InvalidInputError(f"invalid version {version!r}: versions are integers")
        number = int(version)
        found = entry.serving.get(number)
        if found is not None:
            return _up(name, found)
        state = entry.states.get(number)
        if state is not None:
            state_name, reason = state
            raise ModelNotReadyError(
                f"model {name!r} version {number} is {state_name.lower()}"
                + (f": {reason}" if reason else "")
            )
        listed = ", ".join(map(str, sorted(entry.serving))) or "none"
        raise ModelNotFoundError(
            f"model {name!r} has no version {number} (serving versions: {listed})"
        )

    def serving(self, name: str) -> list[ModelVersion]:
        """The versions of ``name`` serving now, oldest first (empty when none)."""
        entry = self._entries.get(name)
        return [] if entry is None else [entry.serving[v] for v in sorted(entry.serving)]

    def all_serving(self) -> list[ModelVersion]:
        return [v for name in sorted(self._entries) for v in self.serving(name)]

    def unready(self) -> list[str]:
        """Why not every model that should be loaded is READY, one line per model or version
        (empty when all are): Triton's strict readiness. A model should be loaded when it was
        asked for (at start, by polling, by a load request) and not unloaded since; a version
        that failed to load or warm up, is still loading, or a model whose config is broken
        and serves nothing, counts. A failed reload that left the previous load serving does not.
        """
        if not self.started:
            return ["the models are still loading"]
        out: list[str] = []
        for name in sorted(self._entries):
            entry = self._entries[name]
            if entry.error is not None and not entry.serving:
                out.append(f"model {name!r}: {entry.error}")
                continue
            if not entry.states and not entry.serving:
                out.append(f"model {name!r} is loading")
                continue
            for version in sorted(entry.states):
                state, reason = _state(entry, version)
                if state != READY and reason != "unloaded":
                    out.append(
                        f"model {name!r} version {version} is {state}"
                        + (f": {reason}" if reason else "")
                    )
        return out

    async def index(self, ready_only: bool = False, engines: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: ``[{"name", "version", "state", "reason"}]``.

        With ``engines`` (not Triton's: for ``ferry serve``'s table), each row also has
        ``"engines"``: what a serving version runs on and in (``openvino bf16``), else ``""``.
        """
        names = set(self._entries) | set(await self._run_blocking(self._list_names))
        rows: list[dict[str, str]] = []
        for name in sorted(names):
            entry = self._entries.get(name)
            if entry is None or (not entry.states and entry.error is None):
                rows.append(_row(name, "", UNAVAILABLE, "not loaded"))
                continue
            for version in sorted(entry.states):
                state, reason = _state(entry, version)
                if entry.error and state == READY:
                    reason = f"{entry.error} (still serving the previous load)"
                rows.append(_row(name, str(version), state, reason))
            if entry.error and not entry.serving:
                rows.append(_row(name, "", UNAVAILABLE, entry.error))
        if ready_only:
            rows = [r for r in rows if r["state"] == READY]
        if engines:
            for row in rows:
                entry = self._entries.get(row["name"])
                served = None
                if entry is not None and row["version"].isdigit():
                    served = entry.serving.get(int(row["version"]))
                row["engines"] = served.loaded.engines_text if served is not None else ""
        return rows

    # -- internals ------------------------------------------------------------------------------

    async def _run_blocking(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._loader, fn, *args)

    def _list_names(self) -> list[str]:
        if self.single is not None:
            return [self.single[0]]
        assert self.root is not None
        try:
            return list_models(self.root)
        except OSError as e:
            logger.warning("cannot list the repository %s: %s", self.root, e)
            return []

    def _exists(self, name: str) -> bool:
        if self.single is not None:
            return name == self.single[0]
        assert self.root is not None
        return (self.root / name).is_dir()

    def _why_not(self, entry: _Entry) -> str:
        if entry.error:
            return entry.error
        reasons = [
            f"version {v} {s.lower()}{': ' + r if r else ''}"
            for v, (s, r) in sorted(entry.states.items())
        ]
        return "; ".join(reasons) or "not loaded"

    def _scan(self, name: str, override: dict[str, Any] | None) -> _Scan:
        """Read a model's config and version folders (blocking)."""
        if self.single is not None:
            path = self.single[1]
            if not path.exists():
                return _Scan(gone=True)
            config = ModelConfig()
            key: str | None = None
            if override is not None:
                try:
                    config = parse_config(override, name, source="the load request's config")
                except ConfigError as e:
                    return _Scan(error=str(e))
                key = json.dumps(override, sort_keys=True)
            files = VersionFiles(1, path, fingerprint(path))
            return _Scan(config=config, config_key=key, versions={1: files})
        assert self.root is not None
        model_dir = self.root / name
        if not model_dir.is_dir():
            return _Scan(gone=True)
        pipeline = pipeline_files(model_dir)  # a pipeline: its file is its one version
        if pipeline is not None:
            return _Scan(config=ModelConfig(), versions=pipeline)
        try:
            if override is not None:
                config = parse_config(override, name, source="the load request's config")
                key = json.dumps(override, sort_keys=True)
            else:
                config, key = read_config(model_dir, name)
        except ConfigError as e:
            return _Scan(error=str(e))
        available: dict[int, Path] = {}
        try:
            for child in model_dir.iterdir():
                if child.is_dir() and child.name.isascii() and child.name.isdigit():
                    available.setdefault(int(child.name), child)
        except OSError as e:
            return _Scan(error=f"cannot read {model_dir}: {e}")
        if not available:
            return _Scan(
                error=f"{model_dir} has no version folders; put the model in {model_dir}/1/model.onnx"
            )
        chosen = config.version_policy.select(list(available))
        if not chosen:
            return _Scan(
                error=f"the version_policy selects none of the versions in {model_dir} "
                f"({', '.join(map(str, sorted(available)))})"
            )
        versions: dict[int, VersionFiles] = {}
        for number in chosen:
            folder = available[number]
            try:
                model_file = find_model_file(folder, config.model_filename)
            except (ModelLoadError, OSError) as e:
                versions[number] = VersionFiles(number, None, fingerprint(folder), str(e))
                continue
            versions[number] = VersionFiles(number, model_file, fingerprint(folder))
        return _Scan(config=config, config_key=key, versions=versions)

    async def _sync(
        self, name: str, *, override: dict[str, Any] | None = None, retry: bool = False
    ) -> None:
        """Bring one model in line with its files: load, reload or unload versions.

        Args:
            override: a config to use in place of config.json (from a load request).
            retry: try again versions whose last load failed even if their files did not change.
        """
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry(name)
        async with entry.lock:
            if self.stopping:
                return
            scan = await self._run_blocking(
                self._scan, name, override if override is not None else entry.override
            )
            if scan.gone:
                self._unload_entry(entry, "removed from the repository")
                if not entry.serving:
                    self._entries.pop(name, None)
                return
            if scan.error is not None or scan.config is None:
                entry.error = scan.error
                return
            entry.error = None
            if override is not None:
                entry.override = override
            if scan.config.warnings and scan.config_key != entry.warned_key:
                for warning in scan.config.warnings:
                    logger.warning("%s", warning)
            entry.warned_key = scan.config_key
            config_changed = scan.config_key != entry.config_key
            wanted = scan.versions
            for number in [n for n in entry.failed if n not in wanted]:
                del entry.failed[number]
            to_load: list[VersionFiles] = []
            for number, files in wanted.items():
                current = entry.fingerprints.get(number) if number in entry.serving else None
                stuck = retry and gave_up(entry.serving.get(number))  # a load request restarts it
                if current == files.fingerprint and not config_changed and not stuck:
                    continue
                attempt = (files.fingerprint, scan.config_key)
                if not retry and entry.failed.get(number) == attempt:
                    continue  # failed before on these very files: wait for them to change
                to_load.append(files)
            for files in to_load:
                if files.version not in entry.serving:
                    entry.states[files.version] = (LOADING, "")
            results = await asyncio.gather(
                *(self._load_version(name, files, scan.config) for files in to_load)
            )
            serving = dict(entry.serving)
            replaced: list[ModelVersion] = []
            all_loaded = True
            for files, result in zip(to_load, results):
                number = files.version
                if isinstance(result, ModelVersion):
                    old = serving.get(number)
                    if old is not None:
                        replaced.append(old)
                    serving[number] = result
                    entry.states[number] = (READY, "")
                    entry.fingerprints[number] = files.fingerprint
                    entry.failed.pop(number, None)
                else:
                    all_loaded = False
                    entry.failed[number] = (files.fingerprint, scan.config_key)
                    if number in serving:
                        entry.states[number] = (
                            READY,
                            f"reload failed, serving the previous load: {result}",
                        )
                    else:
                        entry.states[number] = (UNAVAILABLE, f"load failed: {result}")
            # Versions the policy no longer selects go, unless nothing selected could load: then
            # the old ones keep serving (a failed hot reload must not take the model down).
            if any(number in wanted for number in serving):
                for number in [n for n in serving if n not in wanted]:
                    replaced.append(serving.pop(number))
                    entry.states[number] = (UNAVAILABLE, "unloaded")
                    entry.fingerprints.pop(number, None)
            for number in [n for n in entry.states if n not in wanted and n not in serving]:
                # Not selected any more (or gone): whatever it was, nothing of it should load.
                entry.states[number] = (UNAVAILABLE, "unloaded")
            if all_loaded:
                entry.config_key = scan.config_key
            entry.serving = serving  # the switch: one assignment, on the event loop
            for old in replaced:
                self._retire(old)

    async def _load_version(
        self, name: str, files: VersionFiles, config: ModelConfig
    ) -> ModelVersion | str:
        """Load and warm up one version on the loader thread; the error message on failure."""
        path = files.path
        if files.error is not None or path is None:
            return files.error or "no model file"
        if is_pipeline_file(path):
            recorder = VersionRecorder(self.metrics, name, str(files.version))
            return await load_pipeline(self, name, files, recorder)
        # an artifact folder (ferry serve ARTIFACT/), or the folder of a version's model.onnx
        folder = path if path.is_dir() else path.parent
        generative = is_generative_artifact(folder)
        try:
            if generative:
                parts = await self._run_blocking(
                    lambda: load_generative(
                        name,
                        files.version,
                        folder,
                        config,
                        self.generation,
                        self.metrics,
                        backends=self.backends,
                        threads=self.threads,
                        warmup=self.warmup,
                    )
                )
            else:
                isolate = self.isolate if config.isolate is None else config.isolate
                loaded = await self._run_blocking(
                    lambda: (load_isolated if isolate else load_version)(
                        name,
                        path,
                        config,
                        backends=self.backends,
                        precision=self.precision,
                        optimize=self.optimize,
                        placement=self.placement,
                        warmup=self.warmup,
                        threads=self.threads,
                    )
                )
        except FerryError as e:
            # Start-up failures are reported by the index (and printed by ferry serve); later
            # ones (a poll, a load request) happen while nobody watches, so they are logged.
            level = logging.WARNING if self.started else logging.INFO
            logger.log(level, "model %r version %d failed to load: %s", name, files.version, e)
            return str(e)
        except Exception as e:
            logger.exception("model %r version %d failed to load", name, files.version)
            return f"internal error: {type(e).__name__}: {e}"
        recorder = VersionRecorder(self.metrics, name, str(files.version))
        version: ModelVersion
        if generative:
            version = GenerativeVersion(name, files.version, parts[0], recorder, config, *parts[1:])
        else:
            kind = DeclaredVersion if config.inputs or config.outputs else ModelVersion
            version = kind(
                name, files.version, loaded, recorder, config, self.batcher, self.max_queue_size
            )
        version.start()
        logger.info("model %r version %d is ready", name, files.version)
        return version

    def _unload_entry(self, entry: _Entry, reason: str) -> None:
        for number, version in entry.serving.items():
            entry.states[number] = (UNAVAILABLE, reason)
            self._retire(version)
        entry.serving = {}

    def _retire(self, version: ModelVersion) -> None:
        """Drop a version once its in-flight requests are done (in the background)."""
        task = asyncio.get_running_loop().create_task(version.close())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)


def _row(name: str, version: str, state: str, reason: str) -> dict[str, str]:
    return {"name": name, "version": version, "state": state, "reason": reason}


def _up(name: str, version: ModelVersion) -> ModelVersion:
    """``version``, unless it cannot serve now (an isolated model restarting its worker, a
    pipeline whose step's model is not ready)."""
    why = down_reason(version) or pipeline_down(version)
    if why is not None:
        raise ModelNotReadyError(f"model {name!r} version {version.version} is unavailable: {why}")
    return version


def _state(entry: _Entry, number: int) -> tuple[str, str]:
    """A version's state and reason; a READY one that cannot serve now is UNAVAILABLE."""
    state, reason = entry.states[number]
    served = entry.serving.get(number)
    why = None if served is None else down_reason(served) or pipeline_down(served)
    return (UNAVAILABLE, why) if state == READY and why is not None else (state, reason)
