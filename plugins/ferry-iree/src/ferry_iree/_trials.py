"""Trial answers kept on disk, so a fresh process does not compile every node again.

ferry remembers trial answers per process (by node signature); a new process placing the same
model would compile each distinct node again (the kit's orientation CNN: ~30 s on this 2-core
machine). Answers are kept in ``${FERRY_CACHE_DIR:-~/.cache/ferry}/iree-trials/<version>.json``,
keyed by the one-node model with its weights reduced to their type and shape (values do not
decide whether IREE compiles a node).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path

import onnx

__all__ = ["TrialMemo", "trial_key"]

logger = logging.getLogger(__name__)

#: An initializer with more elements than this is keyed by its type and shape only.
_SMALL = 64


def trial_key(proto: onnx.ModelProto, salt: str) -> str:
    """A key for the trial of ``proto`` (one node): its bytes with large weights' values left
    out, and ``salt`` (what else decides the answer: the trial's compile phase)."""
    light = onnx.ModelProto()
    light.CopyFrom(proto)
    for tensor in light.graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= dim
        if count > _SMALL:
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
                tensor.ClearField(field)
    digest = hashlib.sha256(salt.encode())
    digest.update(light.SerializeToString(deterministic=True))
    return digest.hexdigest()


class TrialMemo:
    """Trial answers (``""`` for taken, else IREE's reason) in one JSON file per IREE version."""

    def __init__(self, version: str) -> None:
        self._version = version
        self._lock = threading.Lock()
        self._answers: dict[str, str] | None = None

    @property
    def path(self) -> Path:
        """The answers' file, beside ferry's engine cache (read each time: tests move it)."""
        from ferry.runtime import default_cache_dir

        return default_cache_dir() / "iree-trials" / f"{self._version}.json"

    def get(self, key: str) -> str | None:
        """The answer stored for ``key``: ``""`` (taken), a reason, or None (never tried)."""
        with self._lock:
            return self._load().get(key)

    def put(self, key: str, answer: str) -> None:
        """Store ``answer`` for ``key``; a cache folder that cannot be written is only logged."""
        with self._lock:
            answers = self._load()
            answers[key] = answer
            path = self.path
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".trials-")
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(answers, f)
                Path(tmp).replace(path)
            except OSError as e:
                logger.debug("iree: trial answers not kept in %s: %s", path, e)

    def _load(self) -> dict[str, str]:
        path = self.path
        if self._answers is None or getattr(self, "_loaded_from", None) != path:
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
                self._answers = {str(k): str(v) for k, v in dict(loaded).items()}
            except (OSError, ValueError, TypeError):
                self._answers = {}
            self._loaded_from = path
        return self._answers
