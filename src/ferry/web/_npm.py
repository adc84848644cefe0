"""onnxruntime-web (and the few other packages a bundle ships) from npm: pinned versions, each
installed once into ferry's cache.

``npm install onnxruntime-web@<version>`` runs into ``<ferry cache>/npm/onnxruntime-web-<version>``
(``~/.cache/ferry/npm/...`` unless ``FERRY_CACHE_DIR`` or ``XDG_CACHE_HOME`` say otherwise) and
every later export reuses it. The install goes into a temporary folder beside it first and is
renamed into place only when the runtime files are all there, so a failed or interrupted install
never leaves a half-filled cache behind.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from ferry.errors import BackendUnavailableError, ExecutionError

__all__ = [
    "ENTRY_MODULE",
    "PINNED_ORT_WEB_VERSION",
    "RUNTIME_STEM",
    "bundle_files",
    "ensure_npm_package",
    "ensure_onnxruntime_web",
    "npm_cache_dir",
    "run_in_node",
]

#: The onnxruntime-web release bundles use. The newest stable release on npm when this was
#: pinned (1.30.0, npm's ``latest`` tag): npm has no 1.31 or 1.32 release to match the installed
#: onnxruntime 1.32, and the newest one is the closest to it in kernels and opset (ONNX opset 26
#: here; IR version 13). Re-run ``python -m ferry.web._gen_ops`` when changing it.
PINNED_ORT_WEB_VERSION = "1.30.0"

#: The ES module bundles import: the wasm backend plus WebGPU (the JSEP build). Its runtime
#: (:data:`RUNTIME_STEM`) has SIMD and threads; ``ort.min.mjs`` loads it from ``wasmPaths``.
ENTRY_MODULE = "ort.min.mjs"
#: The emscripten module and wasm binary ``ort.min.mjs`` loads (``.mjs`` and ``.wasm``).
RUNTIME_STEM = "ort-wasm-simd-threaded.jsep"

_INSTALL_HINT = (
    "building a web bundle needs Node.js and npm: install them (Debian/Ubuntu: "
    "`apt-get install nodejs npm`; elsewhere https://nodejs.org), then run the export again"
)


def npm_cache_dir(version: str, package: str = "onnxruntime-web") -> Path:
    """Where npm ``package@version`` is installed: ``<ferry cache>/npm/<package>-<version>``
    (a scope's ``/`` written ``+``: ``@huggingface+jinja-0.5.11``)."""
    from ferry.runtime import default_cache_dir

    return default_cache_dir() / "npm" / f"{package.replace('/', '+')}-{version}"


def bundle_files(version: str = PINNED_ORT_WEB_VERSION) -> list[str]:
    """The names, in onnxruntime-web's ``dist/``, of the files a bundle's ``ort/`` holds."""
    del version  # one layout for every version pinned so far; kept for the callers' sake
    return [ENTRY_MODULE, f"{RUNTIME_STEM}.mjs", f"{RUNTIME_STEM}.wasm"]


def ensure_onnxruntime_web(version: str = PINNED_ORT_WEB_VERSION) -> Path:
    """The ``dist/`` folder of ``onnxruntime-web@version``, installed with npm if not cached.

    Raises:
        BackendUnavailableError: npm is not installed, or ``npm install`` failed (its last
            lines are in the message).
    """
    files = [f"dist/{name}" for name in bundle_files(version)]
    return ensure_npm_package("onnxruntime-web", version, files) / "dist"


def ensure_npm_package(package: str, version: str, files: list[str]) -> Path:
    """The folder of npm ``package@version`` (``.../node_modules/<package>``), installed with npm
    into ``<ferry cache>/npm/<package>-<version>`` unless ``files`` (paths inside the package)
    are all there already.

    Raises:
        BackendUnavailableError: npm is not installed, or ``npm install`` failed (its last
            lines are in the message).
    """
    root = npm_cache_dir(version, package)
    installed = root / "node_modules" / package
    if all((installed / f).is_file() for f in files):
        return installed
    npm = shutil.which("npm")
    if npm is None:
        raise BackendUnavailableError(f"npm was not found on PATH: {_INSTALL_HINT}")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        try:
            proc = subprocess.run(
                [
                    npm,
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--no-save",
                    "--ignore-scripts",  # the runtime files are prebuilt; nothing needs to run
                    "--prefix",
                    str(tmp),
                    f"{package}@{version}",
                ],
                capture_output=True,
                text=True,
                check=False,
                timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BackendUnavailableError(
                f"`npm install {package}@{version}` could not run ({e}); check npm and "
                "the network access to the npm registry, then run the export again"
            ) from e
        tmp_pkg = tmp / "node_modules" / package
        if proc.returncode != 0 or not all((tmp_pkg / f).is_file() for f in files):
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
            raise BackendUnavailableError(
                f"`npm install {package}@{version}` failed (exit {proc.returncode}); "
                f"check the network access to the npm registry. npm said:\n{tail}"
            )
        if root.exists():
            # An incomplete earlier install (files removed by hand): replace it.
            shutil.rmtree(root)
        tmp.replace(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return installed


def run_in_node(node: str, script: Path, args: list[str], timeout: float, what: str) -> None:
    """Run one of the bundle's Node scripts; ExecutionError naming ``what`` when it runs over
    ``timeout`` seconds or fails (its last stderr line)."""
    try:
        proc = subprocess.run(
            # Liftoff only: V8's optimizing tier would otherwise compile the 28 MB wasm binary
            # in the background for about a minute, on the cores the run needs.
            [node, "--liftoff-only", str(script), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        raise ExecutionError(f"{what} ran over {timeout:.0f} s in Node") from e
    if proc.returncode != 0:
        message = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ExecutionError(f"{what} failed in Node: {message}")
