"""Writing an output folder whole: built beside its destination, then renamed into place.

An exporter (the web bundle, the KServe manifests, the ORT-format export) stages its files in a
new folder on the destination's file system, so that a crash or an error leaves nothing half
written where the user looks, and publishes them with renames.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ferry.errors import InvalidInputError

__all__ = ["publish_dir", "staging_dir"]


def staging_dir(out: Path) -> Path:
    """A new, empty folder beside ``out`` (same file system: it moves into place by renaming).

    Raises:
        InvalidInputError: nothing can be written there.
    """
    anchor = out.absolute().parent
    try:
        anchor.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=anchor))
    except OSError as e:
        raise InvalidInputError(f"cannot write beside {out}: {e}") from e
    # mkdtemp makes the folder 0700; the published one gets what mkdir would give it.
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    return staging


def publish_dir(staging: Path, out: Path) -> None:
    """Swap the staged folder in for ``out``: an old ``out`` is renamed aside first (and renamed
    back if the swap fails), and removed last."""
    if not out.exists():
        staging.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=staging.parent))
    old.rmdir()
    out.rename(old)
    try:
        staging.rename(out)
    except OSError:
        old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
